#!/usr/bin/env bash
# Builds a Python handler into a hookd plugin component (world `handler-plugin` of
# hookd:plugin@0.3.0) with componentize-py.
#
#   plugin-sdk/python/build.sh APP_DIR MODULE OUT.wasm
#
# APP_DIR holds the handler's module MODULE (MODULE.py, or a package MODULE/), which defines a
# class `Handler` with `handle(self, ev)` or a function `handle(ev)`; its other imports are
# looked up there too. The component holds what the module imports at build time (tests beside
# it stay out). componentize-py comes from $COMPONENTIZE_PY, else the PATH, else this
# checkout's target/py-venv (see plugin-sdk/python/README.md to install it).
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 APP_DIR MODULE OUT.wasm" >&2
  exit 2
fi
app_dir=$1 module=$2 out=$3
sdk=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
wit=${HOOKD_WIT:-$sdk/../wit}

if [[ ! $module =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
  echo "$0: MODULE must be a Python module name, not '$module'" >&2
  exit 2
fi
if [[ ! -f $app_dir/$module.py && ! -f $app_dir/$module/__init__.py ]]; then
  echo "$0: no $module.py (nor $module/__init__.py) in $app_dir" >&2
  exit 2
fi
case $module in
  hookd | hookd_entry | wit_world | componentize_py_types | componentize_py_runtime | poll_loop)
    echo "$0: the module name '$module' is taken by the SDK or the generated bindings" >&2
    exit 2
    ;;
esac

componentize=${COMPONENTIZE_PY:-}
if [[ -z $componentize ]]; then
  if command -v componentize-py >/dev/null; then
    componentize=componentize-py
  elif [[ -x $sdk/../../target/py-venv/bin/componentize-py ]]; then
    componentize=$sdk/../../target/py-venv/bin/componentize-py
  else
    echo "$0: componentize-py not found; install the pinned version:" >&2
    echo "  python3 -m venv target/py-venv" >&2
    echo "  target/py-venv/bin/pip install --require-hashes -r plugin-sdk/python/requirements.txt" >&2
    exit 1
  fi
fi
want=$(sed -n 's/^componentize-py==\([^ ]*\).*/\1/p' "$sdk/requirements.txt")
have=$("$componentize" --version | awk '{print $2}')
if [[ $have != "$want" ]]; then
  echo "$0: warning: componentize-py $have, this SDK is tested with $want" >&2
fi

# The entry module componentize-py builds from: the SDK's export around the author's module.
# It and a copy of the SDK package live in a directory of their own, so that nothing else of
# the SDK's directory (tests) ends up in the component.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -R "$sdk/hookd" "$stage/hookd"
find "$stage/hookd" -name __pycache__ -prune -exec rm -rf {} +
rm -f "$stage/hookd/testing.py"
cat >"$stage/hookd_entry.py" <<PY
import $module as app
from hookd._export import handler_export

Handler = handler_export(app)
PY

mkdir -p "$(dirname "$out")"
# componentize-py adds a site-packages to the search path: the `VIRTUAL_ENV`'s, else a
# pipenv's, else those of whatever `python3` is on the PATH. It is given an empty one of its
# own, so the component gets only the app and the SDK, whatever the machine has installed.
mkdir -p "$stage/no-env/lib/site-packages"
env VIRTUAL_ENV="$stage/no-env" PIPENV_ACTIVE= "$componentize" -q -d "$wit" -w handler-plugin \
  componentize -p "$stage" -p "$app_dir" hookd_entry -o "$out.tmp"
mv "$out.tmp" "$out"
echo "built $out ($(wc -c <"$out") bytes)"
