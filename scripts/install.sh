#!/bin/sh
# Install schedguard from its wheel into a virtual environment, then check the install.
#
# The one install procedure: the Dockerfile's build stage runs exactly this script, and
# tests/schedguard/test_dockerfile.py and tests/schedguard/test_packaging.py run it too (the latter with the
# dependencies, from pip's configured indexes), so the image's install steps are tested without a
# Docker engine.
#
#   scripts/install.sh PREFIX WHEEL [--extras LIST] [--no-deps] [--no-pip]
#
#   PREFIX          the virtual environment to create (the image uses /opt/schedguard)
#   WHEEL           the schedguard wheel (python -m pip wheel --no-deps --wheel-dir dist .)
#   --extras LIST   optional extras, comma-separated (the image: redis). Never dev or load:
#                   the runtime gets runtime dependencies only
#   --no-deps       install the wheel alone; the check stops at the command line
#   --no-pip        remove pip and setuptools from the environment afterwards (the image)
#
# Environment: PYTHON (default python3) creates the environment; PIP_* settings are honoured.
set -eu

usage() {
    echo "usage: $0 PREFIX WHEEL [--extras LIST] [--no-deps] [--no-pip]" >&2
    exit 2
}

[ $# -ge 2 ] || usage
prefix=$1
wheel=$2
shift 2
extras=""
nodeps=""
nopip=""
while [ $# -gt 0 ]; do
    case "$1" in
        --extras) [ $# -ge 2 ] || usage; extras=$2; shift 2 ;;
        --no-deps) nodeps=1; shift ;;
        --no-pip) nopip=1; shift ;;
        *) usage ;;
    esac
done
case ",$extras," in
    *,dev,*|*,load,*|*,fuzz,*) echo "install.sh: extras dev, load and fuzz are not runtime dependencies" >&2; exit 2 ;;
esac
[ -f "$wheel" ] || { echo "install.sh: no wheel at $wheel" >&2; exit 2; }

python=${PYTHON:-python3}
"$python" -m venv "$prefix"
target=$wheel
[ -z "$extras" ] || target="schedguard[$extras] @ file://$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"
if [ -n "$nodeps" ]; then
    "$prefix/bin/python" -m pip install --no-cache-dir --disable-pip-version-check --no-deps "$target"
else
    "$prefix/bin/python" -m pip install --no-cache-dir --disable-pip-version-check "$target"
fi

# Check: the command runs, and (with its dependencies) the commands the image offers run for
# real (the default policy loads with its tokenizer, the fuzz targets list), and the runtime
# holds no development or load-test packages.
"$prefix/bin/schedguard" --help >/dev/null
"$prefix/bin/schedguard" --version
if [ -z "$nodeps" ]; then
    "$prefix/bin/python" -c "import guard.app, guard.server, scheduler_ref.server, fuzz.targets"
    "$prefix/bin/schedguard" policy show >/dev/null
    "$prefix/bin/schedguard" fuzz list >/dev/null
    for dev in pytest locust mypy hypothesis; do
        if "$prefix/bin/python" -c "import $dev" 2>/dev/null; then
            echo "install.sh: $dev is installed in the runtime environment" >&2
            exit 1
        fi
    done
    "$prefix/bin/python" -m pip check --disable-pip-version-check >/dev/null
fi
if [ -n "$nopip" ]; then
    "$prefix/bin/python" -m pip uninstall --yes --quiet pip setuptools
fi
echo "install.sh: schedguard installed in $prefix"
