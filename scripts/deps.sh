#!/bin/sh
# Makes sure the Debian packages gpurent needs are installed: as root it
# installs the missing ones, otherwise it prints the exact apt-get line and fails.
# Usage: scripts/deps.sh build|test|bench
set -eu

build_pkgs="gcc make pkg-config libmicrohttpd-dev libjansson-dev libcurl4-openssl-dev
libsqlite3-dev libssl-dev libgnutls28-dev libinih-dev libsystemd-dev libssh-dev
libwslay-dev"
test_pkgs="libcmocka-dev python3 python3-pytest python3-requests python3-aiosmtpd sqlite3 openssl openssh-client
prometheus pdsh chromium fonts-wqy-microhei
python3-websocket python3-pytest-xdist python3-jsonschema"
# make bench: the references (nginx serving the same bytes, wrk driving both)
# and the profiler (issue 15).
bench_pkgs="nginx-light wrk linux-perf"

case "${1:-build}" in
  build) want="$build_pkgs" ;;
  test)  want="$build_pkgs $test_pkgs" ;;
  bench) want="$build_pkgs $test_pkgs $bench_pkgs" ;;
  *) echo "usage: $0 build|test|bench" >&2; exit 2 ;;
esac

missing=""
for p in $want; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing="$missing $p"
  fi
done
npm_tools() {
  # The tests' npm tools (package.json, package-lock.json): installed again
  # when the lock file is newer than what node_modules holds.
  [ "${1:-}" = test ] || return 0
  if ! command -v npm >/dev/null 2>&1; then
    echo "gpurent's checks need Node.js and npm; install them with:" >&2
    echo "  sudo apt-get install -y nodejs npm" >&2
    exit 1
  fi
  if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    echo "installing the npm tools of package-lock.json into node_modules"
    npm ci --no-audit --no-fund --loglevel=error
  fi
}

if [ -z "$missing" ]; then
  npm_tools "${1:-build}"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  echo "installing missing Debian packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing
  npm_tools "${1:-build}"
else
  echo "gpurent needs these Debian packages; install them with:" >&2
  echo "  sudo apt-get install -y$missing" >&2
  exit 1
fi
