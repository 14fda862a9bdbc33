#!/usr/bin/env bash
# The walls between rooms, checked (CI runs this): which crates a module may name, and no
# dependency a crate does not use. Prints every offence and fails if there is one.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=0

# Only the SQLite backend room speaks SQLite, only the PostgreSQL backend room speaks
# PostgreSQL; only the runtime room names wasmtime (in code; a comment may say what another room
# does).
room() { # <crate name as written in code> <the one directory allowed to name it>
  local offences
  offences=$(grep -rnE "\b$1(_[a-z_]+)?\b" host/src --include='*.rs' | grep -v "^$2" \
    | grep -vE '^[^:]+:[0-9]+: *//' || true)
  if [[ -n $offences ]]; then
    echo "walls: '$1' is named outside $2:"
    echo "$offences" | sed 's/^/  /'
    failed=1
  fi
}
room rusqlite host/src/inbox/sqlite/
room tokio_postgres host/src/inbox/postgres/
room deadpool_postgres host/src/inbox/postgres/
room postgres_types host/src/inbox/postgres/
room wasmtime host/src/runtime/
# A walled crate renamed in a manifest (the workspace's, whose names host inherits, or host's)
# would get past the name checks above.
offences=$(grep -nHE "package *= *[\"'](rusqlite|tokio-postgres|deadpool-postgres|postgres-types|wasmtime[a-z-]*)[\"']" \
  Cargo.toml host/Cargo.toml || true)
if [[ -n $offences ]]; then
  echo "walls: a walled crate is renamed:"
  echo "$offences" | sed 's/^/  /'
  failed=1
fi

# Only the plugin SDK binds the WIT for guests (and the deliberately wrong test plugin).
offences=$(grep -rnE '\bwit_bindgen\b' host plugins tests --include='*.rs' --exclude-dir=target \
  | grep -v '^tests/plugins/mismatch/' | grep -vE '^[^:]+:[0-9]+: *//' || true)
if [[ -n $offences ]]; then
  echo "walls: wit_bindgen is named outside plugin-sdk:"
  echo "$offences" | sed 's/^/  /'
  failed=1
fi

# Commands print with `say!` (a reader that went away ends them quietly), never `println!`
# (which panics on a broken pipe).
offences=$(grep -rn 'println!' host/src/cli --include='*.rs' | grep -v 'eprintln!' \
  | grep -vE '^[^:]+:[0-9]+: *//' || true)
if [[ -n $offences ]]; then
  echo "walls: println! in a command (use say!):"
  echo "$offences" | sed 's/^/  /'
  failed=1
fi

# Every declared dependency is used in its crate's code: a path through it (`name::`), a macro
# (`name!`) or a `use`, outside comments and outside the crates nested in its directory (a
# dependency used only through Cargo features would need an exception here; there is none).
for manifest in host/Cargo.toml host/*/Cargo.toml plugin-sdk/Cargo.toml tests/Cargo.toml \
  plugins/*/Cargo.toml tests/plugins/*/Cargo.toml; do
  [[ $manifest == host/fuzz/* ]] && continue
  crate_dir=$(dirname "$manifest")
  deps=$(awk '
    /^\[/ { in_deps = ($0 ~ /dependencies\]$/) ; next }
    in_deps && /^[A-Za-z0-9_-]+ *[=.]/ { sub(/[ .=].*/, ""); print }
  ' "$manifest")
  for dep in $deps; do
    ident=${dep//-/_}
    # `host` is the package name; `[[bin]]`-style renames do not occur here.
    # Crates nested in this one's directory (host/verify, tests/plugins/*) use their own.
    nested=()
    for inner in $(find "$crate_dir" -mindepth 2 -name Cargo.toml -not -path '*/target/*'); do
      inner=${inner#"$crate_dir"/}
      nested+=(--exclude-dir="${inner%%/*}")
    done
    uses=$(grep -rnE "(^|[^A-Za-z0-9_])$ident(::|!)|use $ident\b|extern crate $ident" "$crate_dir" \
      --include='*.rs' --exclude-dir=target --exclude-dir=fuzz "${nested[@]}" \
      | grep -vE '^[^:]+:[0-9]+: *//' || true)
    if [[ -z $uses ]]; then
      echo "walls: $manifest declares '$dep', which no source file of the crate uses"
      failed=1
    fi
  done
done

# A released WIT is frozen: plugins built against it must keep loading. A change to a released
# version's files is an offence; a new version gets a new directory and a line here.
frozen_wit() { # <directory> <sha256 recorded at its release>
  local actual
  # every file of the version, by relative path (a file added to it counts as a change)
  actual=$(cd "$1" && find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)
  if [[ $actual != "$2" ]]; then
    echo "walls: $1 is a released WIT and frozen (sha256 $2), but it now hashes to $actual"
    failed=1
  fi
}
frozen_wit wit/v0.1.0 d16e591ad556a796c6087c3ff4a9c52b2841d9c17268efc6d0ac4b5de40bb8fb
frozen_wit wit/v0.2.0 1a18d0f8b83ac4d1ae2be2d81b7f7ffc0690e3f3658158076b9e45f3f300f79f
frozen_wit wit/v0.3.0 017b92d537ba8b870394b103a90351139a50abc34919b43dcc9182a2a9d15f29
# The components built against released WITs are kept as built, never rebuilt: each one's sha256
# is the one its directory's README records.
for component in tests/fixtures/*/*.wasm; do
  hash=$(sha256sum "$component" | cut -d' ' -f1)
  readme="$(dirname "$component")/README.md"
  # The README says "`<name>` sha256 `<hash>`", perhaps across a line break.
  if ! tr -s ' \n' '  ' < "$readme" | grep -qF "\`$(basename "$component")\` sha256 \`$hash\`"; then
    echo "walls: $component hashes to $hash, which $readme does not record for it (a kept component is never rebuilt)"
    failed=1
  fi
done
# The SDK carries its own copy of the latest WIT (so the crate is self-contained): the same files.
if ! diff -r wit/v0.3.0 plugin-sdk/wit >/dev/null; then
  echo "walls: plugin-sdk/wit differs from wit/v0.3.0 (the SDK's copy of the latest WIT):"
  diff -r wit/v0.3.0 plugin-sdk/wit | head -20 | sed 's/^/  /'
  failed=1
fi

exit $failed
