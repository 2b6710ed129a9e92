#!/usr/bin/env bash
# run-local.sh: starts a local gpurent for trying it out, as `make run` does
# after the build: gpurentd on 127.0.0.1:${GPURENT_PORT:-8080} with its
# database under ./var/, created and migrated on the first run. The first run
# also saves the bootstrap admin API key (printed once by gpurentd) in
# var/admin.key, mode 0600, so every later run can still show how to use it.
#
# gpurentd's log goes to this terminal; Ctrl-C (or SIGTERM to this script)
# stops it cleanly and this script exits with its status.
#
# Environment:
#   GPURENT_PORT          port to listen on (default 8080)
#   GPURENT_CORS_ORIGINS  browser origins allowed by CORS (default: this
#                         server under both http://127.0.0.1:PORT and
#                         http://localhost:PORT, so a console page opened under
#                         either name can call the other)
#   GPURENTD              the gpurentd binary (default build/gpurentd)
set -euo pipefail

cd "$(dirname "$0")/.."

port=${GPURENT_PORT:-8080}
gpurentd=${GPURENTD:-build/gpurentd}
cors=${GPURENT_CORS_ORIGINS:-"http://127.0.0.1:$port http://localhost:$port"}
var=var
db=$var/gpurent.db
key_file=$var/admin.key
stdout_file=$var/gpurentd.stdout
base=http://127.0.0.1:$port

case $port in
  ''|*[!0-9]*) echo "run-local: GPURENT_PORT must be a port number, not '$port'" >&2; exit 2 ;;
esac
if [ ! -x "$gpurentd" ]; then
  echo "run-local: $gpurentd is not built; run 'make run' (or 'make' first)" >&2
  exit 1
fi

# Whether something accepts TCP connections on 127.0.0.1:$port (bash's
# /dev/tcp, so this needs no curl).
port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

if port_open; then
  echo "run-local: something already listens on 127.0.0.1:$port;" \
       "stop it or choose another port: GPURENT_PORT=8081 make run" >&2
  exit 1
fi

mkdir -p "$var"
chmod 0700 "$var"

# gpurentd prints the bootstrap admin key on standard output, once, before it
# starts listening. Its standard output goes to a private file (appended, so
# the file can be read while gpurentd writes it); its log (stderr) goes to
# this terminal.
rm -f "$stdout_file"
(umask 077 && : > "$stdout_file")

"$gpurentd" -c conf/gpurentd.conf --db "$db" --listen "127.0.0.1:$port" \
  -o "cors_origins=$cors" >>"$stdout_file" &
pid=$!

# Forward Ctrl-C and SIGTERM to gpurentd as SIGTERM (drain, then exit 0),
# and keep waiting for it to finish.
stopping=0
stop() {
  stopping=1
  kill -TERM "$pid" 2>/dev/null || true
}
trap stop INT TERM

# Wait until gpurentd listens (migrating a new database takes a moment), or
# report why it did not start.
for _ in $(seq 1 200); do
  if ! kill -0 "$pid" 2>/dev/null; then
    status=0
    wait "$pid" || status=$?
    [ "$stopping" = 1 ] && exit "$status"
    echo "run-local: gpurentd exited during start-up (status $status); its log is above" >&2
    exit 1
  fi
  port_open && break
  sleep 0.05
done
if ! port_open; then
  echo "run-local: gpurentd did not start listening on 127.0.0.1:$port within 10 seconds" >&2
  stop
  wait "$pid" || true
  exit 1
fi

# The key is the last line of what gpurentd printed, on a new database only.
new_key=$(grep -E '^gpk_[a-z0-9]+_[0-9a-f]+$' "$stdout_file" | tail -n 1 || true)
if [ -n "$new_key" ]; then
  (umask 077 && printf '%s\n' "$new_key" > "$key_file.tmp")
  chmod 0600 "$key_file.tmp"
  mv -f "$key_file.tmp" "$key_file"
fi

# ---------------------------------------------------------------------------
# SIMULATED FLEET (planned, not started yet).
# A later issue starts a simulated GPU fleet here, once gpurentd is up, and
# stops it with gpurentd:
#
#   build/gpurent-agent sim-fleet --control-plane "$base" \
#     --admin-key "$(cat "$key_file")" --model MI450 --nodes 4 --cards 8 \
#     --fabric fabric-a --region local --listen "127.0.0.1:$((port + 1))" \
#     --state-dir "$var/fleet" &
#   fleet_pid=$!
#
# (and stop() then also signals $fleet_pid, and the script waits for both).
# ---------------------------------------------------------------------------

admin_key=""
[ -r "$key_file" ] && admin_key=$(head -n 1 "$key_file")

cat <<EOF

==============================================================================
 gpurent is running at $base   (database $db)
==============================================================================
EOF
if [ -n "$new_key" ]; then
  echo " A new database: its first admin is admin@localhost. The admin API key,"
  echo " shown once by gpurentd, is saved in $key_file (mode 0600)."
elif [ -n "$admin_key" ]; then
  echo " The admin API key from the first run is in $key_file."
else
  cat <<EOF
 $key_file is missing (the admin key is printed only when the database is
 created). Make another admin key, even while gpurentd runs, with:
   $gpurentd admin create-user --db $db --email you@example.com --admin
 or start from scratch: stop this, 'rm -rf var', 'make run'.
EOF
fi
cat <<EOF

 Try it (in another terminal):

   # sign up: the reply holds your first API key ("token"), shown once
   curl -s -X POST $base/v1/signup \\
        -d '{"email":"ada@example.com","password":"correct horse battery"}'

   # log in: every login returns a new API key
   curl -s -X POST $base/v1/login \\
        -d '{"email":"ada@example.com","password":"correct horse battery"}'

   # call the API with a key
   KEY=gpk_...   # the "token" from signup or login
   curl -s $base/v1/me -H "Authorization: Bearer \$KEY"
   curl -s $base/v1/api-keys -H "Authorization: Bearer \$KEY"
EOF
if [ -n "$admin_key" ]; then
  cat <<EOF

   # the same as the admin
   curl -s $base/v1/me -H "Authorization: Bearer \$(cat $key_file)"
EOF
fi
cat <<EOF

   # what the API offers (OpenAPI 3), and whether the server is up
   curl -s $base/v1/openapi.json
   curl -s $base/healthz

 Ctrl-C stops gpurentd; the data stays in $var/ for the next 'make run'.
==============================================================================

EOF

# Wait for gpurentd. A trapped signal interrupts wait; keep waiting until
# gpurentd has really exited, then exit with its status.
status=0
while :; do
  status=0
  wait "$pid" || status=$?
  kill -0 "$pid" 2>/dev/null || break
done
if [ "$stopping" = 1 ] && [ "$status" = 0 ]; then
  echo "run-local: gpurentd stopped cleanly"
fi
exit "$status"
