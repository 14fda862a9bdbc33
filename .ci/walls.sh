#!/usr/bin/env bash
# The walls between rooms, checked (CI runs this): which crates a module may name, and no
# dependency a crate does not use. Prints every offence and fails if there is one.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=0

# Only the storage room speaks SQLite; only the runtime room names wasmtime (in code; a comment
# may say what another room does).
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
room rusqlite host/src/inbox/
room wasmtime host/src/runtime/

# Every declared dependency is named somewhere in its crate (a dependency used only through
# Cargo features would need an exception here; there is none).
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
    if ! grep -rqw "$ident" "$crate_dir" --include='*.rs' --exclude-dir=target --exclude-dir=fuzz; then
      echo "walls: $manifest declares '$dep', which no source file of the crate uses"
      failed=1
    fi
  done
done

exit $failed
