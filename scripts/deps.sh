#!/bin/sh
# Makes sure the Debian packages gpurent needs are installed: as root it
# installs the missing ones, otherwise it prints the exact apt-get line and fails.
# Usage: scripts/deps.sh build|test
set -eu

build_pkgs="gcc make pkg-config libmicrohttpd-dev libjansson-dev libcurl4-openssl-dev
libsqlite3-dev libssl-dev libinih-dev libsystemd-dev libssh-dev"
test_pkgs="libcmocka-dev python3 python3-pytest python3-requests python3-aiosmtpd sqlite3 openssl openssh-client"

case "${1:-build}" in
  build) want="$build_pkgs" ;;
  test)  want="$build_pkgs $test_pkgs" ;;
  *) echo "usage: $0 build|test" >&2; exit 2 ;;
esac

missing=""
for p in $want; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing="$missing $p"
  fi
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  echo "installing missing Debian packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing
else
  echo "gpurent needs these Debian packages; install them with:" >&2
  echo "  sudo apt-get install -y$missing" >&2
  exit 1
fi
