#!/usr/bin/env bash
# shellcheck disable=SC2086  # fleet specs are split into words on purpose
# run-local.sh: starts a local gpurent for trying it out, as `make run` does
# after the build: gpurentd on 127.0.0.1:${GPURENT_PORT:-8080} with its
# database under ${GPURENT_VAR:-var/} (the repository's var/ by default),
# created and migrated on the first run, and next to
# it a small simulated GPU fleet registered through the admin API:
#
#   4 nodes x 8 MI450    fabric-a   gpurent-agent sim-fleet on PORT+1
#   2 nodes x 8 MI300X   fabric-a   gpurent-agent sim-fleet on PORT+2
#   1 node  x 8 H100-SXM fabric-b   gpurent-agent sim-fleet on PORT+3
#
# Each node serves SSH on 127.0.0.1, from GPURENT_SSH_PORT (2222) on, and
# volumes are directories under VAR/volumes that every node shares.
#
# The first run also saves the bootstrap admin API key (printed once by
# gpurentd, and shown once in the banner) in VAR/admin.key, mode 0600; the
# fleets use it to register their nodes and keep each node's secret under
# VAR/fleet/, so every later run on the same VAR and ports finds the same
# nodes working again. It also gives H100-SXM, which the seed catalog
# leaves unpriced, a price of 2.00 per card-hour on a new database, so that
# its node can be reserved.
#
# gpurentd's log goes to this terminal, the fleets' output to
# VAR/fleet/NAME.log; Ctrl-C (or SIGTERM to this script) stops everything
# cleanly and this script exits with gpurentd's status. While it runs, its
# process id is in VAR/run-local.pid: `run-local.sh stop` (make stop), with
# the same GPURENT_VAR, sends it SIGTERM from another terminal and waits
# until everything has stopped.
#
# Environment:
#   GPURENT_PORT          port to listen on (default 8080); the fleets use the
#                         three ports after it
#   GPURENT_SSH_PORT      the first of the seven nodes' SSH ports (default 2222)
#   GPURENT_FLEET         0 starts gpurentd alone, without the fleet
#   GPURENT_VAR           the state directory VAR (default var in the
#                         repository; a relative path is taken from the
#                         directory this script is started in): the
#                         database, admin.key, gpurentd.stdout and fleet/.
#                         Nodes are registered with their ports, so reuse a
#                         state directory with the same GPURENT_PORT
#   GPURENT_CORS_ORIGINS  browser origins allowed by CORS (default: this
#                         server under both http://127.0.0.1:PORT and
#                         http://localhost:PORT, so a console page opened under
#                         either name can call the other)
#   GPURENT_GATEWAY_PORT  gpurent-gateway's port (default PORT+4); the demo
#                         app "echo" (a sim-model-server replica, scaled from
#                         zero on the first call) is published on the first run
#   GPURENTD              the gpurentd binary (default build/gpurentd)
#   GPURENT_AGENT         the gpurent-agent binary (default build/gpurent-agent)
set -euo pipefail

# GPURENT_VAR is read before the cd below, so a relative one names a
# directory under the caller's; the default is the repository's var/. Either
# way var is absolute: the fleets' state directories are under it, and a sim
# container's HOME and GPURENT_HOSTFILE are paths there, which must resolve
# from the container directory a shell starts in.
var=${GPURENT_VAR:-}
case $var in
  '') ;;
  /*) ;;
  *) var=$PWD/$var ;;
esac

cd "$(dirname "$0")/.."
stop_command="make stop"
[ -n "$var" ] && stop_command="GPURENT_VAR=$var make stop"
[ -n "$var" ] || var=$PWD/var
pid_file=$var/run-local.pid

# run-local.sh stop (make stop): SIGTERM to the run-local.sh whose process
# id VAR/run-local.pid holds, which stops what it started as Ctrl-C does;
# returns once it has exited. The process must still be a run-local.sh: a
# file left by one killed outright may name a process id now reused.
if [ $# -gt 0 ]; then
  if [ "$1" != stop ] || [ $# -gt 1 ]; then
    echo "run-local: unknown arguments '$*': none starts gpurent, 'stop' stops the one using $var" >&2
    exit 2
  fi
  running=$(head -n 1 "$pid_file" 2>/dev/null || true)
  case $running in
    ''|*[!0-9]*) running="" ;;
  esac
  if [ -z "$running" ] || ! tr '\0' ' ' <"/proc/$running/cmdline" 2>/dev/null | grep -q 'run-local\.sh'; then
    echo "run-local: no make run is running on $var"
    exit 0
  fi
  # Running: there and not a zombie (one that has exited, which its parent
  # has not yet collected, still takes kill -0).
  running_still() {
    kill -0 "$running" 2>/dev/null &&
      [ "$(sed 's/.*) \(.\).*/\1/' "/proc/$running/stat" 2>/dev/null)" != Z ]
  }
  kill -TERM "$running" 2>/dev/null || true
  for _ in $(seq 1 1200); do
    running_still || break
    sleep 0.05
  done
  if running_still; then
    echo "run-local: make run (process $running) has not stopped within 60 seconds" >&2
    exit 1
  fi
  echo "run-local: stopped make run (process $running) on $var"
  exit 0
fi

port=${GPURENT_PORT:-8080}
ssh_port=${GPURENT_SSH_PORT:-2222}
with_fleet=${GPURENT_FLEET:-1}
gpurentd=${GPURENTD:-build/gpurentd}
agent=${GPURENT_AGENT:-build/gpurent-agent}
cors=${GPURENT_CORS_ORIGINS:-"http://127.0.0.1:$port http://localhost:$port"}
gateway=${GPURENT_GATEWAY_BIN:-build/gpurent-gateway}
db=$var/gpurent.db
key_file=$var/admin.key
stdout_file=$var/gpurentd.stdout
fleet_dir=$var/fleet
base=http://127.0.0.1:$port

# A port variable's value: a number from 1 to its most (the ports after it
# that the variable's users take leave room), else the run stops here.
check_port() { # NAME VALUE MOST WHY-THE-MOST
  case $2 in
    ''|*[!0-9]*) echo "run-local: $1 must be a port number, not '$2'" >&2; exit 2 ;;
  esac
  if [ "$2" -lt 1 ] || [ "$2" -gt "$3" ]; then
    echo "run-local: $1 must be from 1 to $3$4" >&2
    exit 2
  fi
}
check_port GPURENT_SSH_PORT "$ssh_port" 65529 " (the nodes use it and the next six)"
check_port GPURENT_PORT "$port" 65532 " (the fleet uses the next three)"
# Computed once GPURENT_PORT is known to be a number: bash's arithmetic
# would take a word for a variable's name.
gw_port=${GPURENT_GATEWAY_PORT:-$((port + 4))}
if [ -z "${GPURENT_GATEWAY_PORT:-}" ] && [ "$gw_port" -gt 65535 ]; then
  echo "run-local: the gateway's port $gw_port is not from 1 to 65535 (GPURENT_GATEWAY_PORT, default GPURENT_PORT+4)" >&2
  exit 2
fi
check_port GPURENT_GATEWAY_PORT "$gw_port" 65535 ""
if [ ! -x "$gpurentd" ]; then
  echo "run-local: $gpurentd is not built; run 'make run' (or 'make' first)" >&2
  exit 1
fi
if [ "$with_fleet" != 0 ] && [ ! -x "$agent" ]; then
  echo "run-local: $agent is not built; run 'make run' (or 'make' first)" >&2
  exit 1
fi

# The simulated fleet, one sim-fleet process per GPU model (each serves its
# nodes under http://127.0.0.1:PORT/nodes/NAME):
#   name    model     nodes  cards  fabric    port
# Each node serves SSH on its own port from GPURENT_SSH_PORT (2222) on:
# the MI450 nodes 2222-2225, the MI300X ones 2226-2227, the H100 2228; and
# publishes instances' ports on its own 100 host ports from 30000 on (each
# fleet gets its own part of the range; sim_publish_ports_per_node splits it).
#   name    model     nodes  cards  fabric    port          first SSH port    published ports
fleets=(
  "mi450    MI450     4      8      fabric-a  $((port + 1))  $ssh_port          30000-30399"
  "mi300x   MI300X    2      8      fabric-a  $((port + 2))  $((ssh_port + 4))  30400-30599"
  "h100     H100-SXM  1      8      fabric-b  $((port + 3))  $((ssh_port + 6))  30600-30699"
)
[ "$with_fleet" = 0 ] && fleets=()

# Whether something accepts TCP connections on 127.0.0.1:$1 (bash's
# /dev/tcp, so this needs no curl).
port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# The gateway starts with the fleet (it needs a replica to route to).
gateway_ports=()
[ ${#fleets[@]} -gt 0 ] && [ -x "$gateway" ] && gateway_ports=("$gw_port")
for p in "$port" $(for f in "${fleets[@]}"; do set -- $f; echo "$6"; seq "$7" $(($7 + $3 - 1)); done) \
         ${gateway_ports[@]+"${gateway_ports[@]}"}; do
  if port_open "$p"; then
    echo "run-local: something already listens on 127.0.0.1:$p;" \
         "stop it or choose other ports: GPURENT_PORT=9080 make run" >&2
    exit 1
  fi
done

mkdir -p "$var"
chmod 0700 "$var"

# gpurentd prints the bootstrap admin key on standard output, once, before it
# starts listening. Its standard output goes to a private file (appended, so
# the file can be read while gpurentd writes it); its log (stderr) goes to
# this terminal.
rm -f "$stdout_file"
(umask 077 && : > "$stdout_file")

# Volumes are directories under VAR/volumes, which every simulated node of
# this machine sees, as a network file system would make them: a file put
# into /shared through one node is there on the others.
mkdir -p "$var/volumes"
volumes=$(cd "$var/volumes" && pwd)
# The key gpurent-gateway signs its internal calls with (the marketplace).
if [ ! -s "$var/gateway.secret" ]; then
  (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$var/gateway.secret" && echo >> "$var/gateway.secret")
fi
"$gpurentd" -c conf/gpurentd.conf --db "$db" --listen "127.0.0.1:$port" \
  -o "cors_origins=$cors" -o "volume_source_template=$volumes/{volume_id}" -o volume_source_shared=true \
  -o "gateway_secret_file=$var/gateway.secret" -o "gateway_public_url=http://127.0.0.1:$gw_port" \
  -o "console_dir=$PWD/console" >>"$stdout_file" &
pid=$!
fleet_pids=()

# Forward Ctrl-C and SIGTERM to gpurentd and the fleets as SIGTERM (drain,
# then exit 0), and keep waiting for them to finish. (Background jobs of a
# script ignore the terminal's SIGINT, so this is what stops them.)
stopping=0
stop() {
  stopping=1
  kill -TERM "$pid" ${fleet_pids[@]+"${fleet_pids[@]}"} 2>/dev/null || true
}
trap stop INT TERM

# Stops the fleets (if any still run) and waits for them.
stop_fleets() {
  [ ${#fleet_pids[@]} -eq 0 ] && return 0
  kill -TERM "${fleet_pids[@]}" 2>/dev/null || true
  for fp in "${fleet_pids[@]}"; do
    while kill -0 "$fp" 2>/dev/null; do wait "$fp" 2>/dev/null || true; done
  done
}

# Waits for gpurentd to exit, whatever interrupts the wait, and exits with
# its status after stopping the fleets.
finish() {
  local status=0
  while :; do
    status=0
    wait "$pid" || status=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  stop_fleets
  # gpurentd exits 0 only when told to stop. Ctrl-C reaches it as it
  # reaches this script, and it may be gone before the trap has run.
  if [ "$status" = 0 ]; then
    echo "run-local: gpurentd${fleet_pids[0]:+ and the fleet} stopped cleanly"
  fi
  exit "$status"
}

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
  port_open "$port" && break
  sleep 0.05
done
if ! port_open "$port"; then
  echo "run-local: gpurentd did not start listening on 127.0.0.1:$port within 10 seconds" >&2
  stop
  wait "$pid" || true
  exit 1
fi

# Written once gpurentd listens, so holds this state directory's database (a
# second run on it has been refused by then); removed at exit if still ours.
echo "$$" > "$pid_file"
trap '[ "$(head -n 1 "$pid_file" 2>/dev/null)" = "$$" ] && rm -f "$pid_file"' EXIT

# The key is the last line of what gpurentd printed, on a new database only.
new_key=$(grep -E '^gpk_[a-z0-9]+_[0-9a-f]+$' "$stdout_file" | tail -n 1 || true)
made_key=""
if [ -n "$new_key" ]; then
  (umask 077 && printf '%s\n' "$new_key" > "$key_file.tmp")
  chmod 0600 "$key_file.tmp"
  mv -f "$key_file.tmp" "$key_file"
elif [ ! -s "$key_file" ] && [ ${#fleets[@]} -gt 0 ]; then
  # An old database whose admin key was lost: the fleet needs an admin to
  # register its nodes, so make one (safe while gpurentd runs).
  made_key=ops-$(date +%s)@localhost
  if out=$("$gpurentd" admin create-user --db "$db" --email "$made_key" --admin 2>&1); then
    (umask 077 && printf '%s\n' "$out" | tail -n 1 > "$key_file.tmp")
    chmod 0600 "$key_file.tmp"
    mv -f "$key_file.tmp" "$key_file"
  else
    echo "run-local: cannot create an admin for the fleet: $out" >&2
    made_key=""
  fi
fi

# ---------------------------------------------------------------------------
# The simulated fleet
# ---------------------------------------------------------------------------
fleet_failed=0
if [ ${#fleets[@]} -gt 0 ] && [ -s "$key_file" ]; then
  mkdir -p "$fleet_dir"
  chmod 0700 "$fleet_dir"
  for f in "${fleets[@]}"; do
    set -- $f
    # Each process keeps its nodes' secrets in its own state directory
    # (VAR/fleet/NAME/nodes/NODE/registration.json), which it also locks.
    "$agent" sim-fleet --control-plane "$base" --admin-key-file "$key_file" \
      --model "$2" --nodes "$3" --cards "$4" --fabric "$5" --region local \
      --listen "127.0.0.1:$6" --state-dir "$fleet_dir/$1" -o "ssh_listen=127.0.0.1:$7" -o "publish_port_range=$8" \
      >"$fleet_dir/$1.log" 2>&1 &
    fleet_pids+=($!)
  done
  # Each fleet prints "fleet ready" once all its nodes are registered (or
  # were already); registration takes a moment per node.
  i=0
  for f in "${fleets[@]}"; do
    set -- $f
    fp=${fleet_pids[$i]}
    i=$((i + 1))
    for _ in $(seq 1 300); do
      [ "$stopping" = 1 ] && finish
      grep -q '^fleet ready' "$fleet_dir/$1.log" 2>/dev/null && break
      kill -0 "$fp" 2>/dev/null || break
      sleep 0.05
    done
    if ! grep -q '^fleet ready' "$fleet_dir/$1.log" 2>/dev/null; then
      echo "run-local: the $2 fleet did not start; the end of $fleet_dir/$1.log:" >&2
      tail -n 5 "$fleet_dir/$1.log" >&2 || true
      fleet_failed=1
    elif grep -q ' FAILED ' "$fleet_dir/$1.log"; then
      grep ' FAILED ' "$fleet_dir/$1.log" | sed 's/^/run-local: /' >&2
      fleet_failed=1
    fi
  done
fi
[ "$stopping" = 1 ] && finish

admin_key=""
[ -r "$key_file" ] && admin_key=$(head -n 1 "$key_file")

# The seed catalog has no price for H100-SXM (booked ahead only), and a type
# without one cannot be booked: on a new database give it 2.00 per
# card-hour, so the reservation examples of README.md book a block of the
# H100 node (8 cards x 3 hours: 48.00). An admin may change it later.
if [ -n "$new_key" ] && [ -n "$admin_key" ] && command -v curl >/dev/null; then
  status=$(curl -s -o /dev/null -w '%{http_code}' -X PUT "$base/v1/admin/prices/H100-SXM" \
    -H "Authorization: Bearer $admin_key" -H 'Content-Type: application/json' \
    -d '{"price_per_card_hour":"2.00","reason":"make run: the local H100-SXM node can be reserved"}' || true)
  [ "$status" = 200 ] || echo "run-local: pricing H100-SXM for reservations failed (HTTP $status)" >&2
fi

# ---------------------------------------------------------------------------
# The marketplace: gpurent-gateway and the demo app "echo"
# ---------------------------------------------------------------------------
demo_app=""
if [ -x "$gateway" ] && [ ${#fleet_pids[@]} -gt 0 ] && [ -n "$admin_key" ] && command -v curl >/dev/null; then
  "$gateway" --listen "127.0.0.1:$gw_port" --control-url "$base" --secret-file "$var/gateway.secret" \
    --gateway-id local --state-dir "$var/gateway" >"$var/gateway.log" 2>&1 &
  fleet_pids+=($!)
  auth="Authorization: Bearer $admin_key"
  admin_id=$(curl -s "$base/v1/me" -H "$auth" | grep -o 'usr_[a-z0-9]*' | head -n 1)
  # The publisher pays its replicas' card time: the admin gets 1000 yuan once.
  curl -s -o /dev/null -X POST "$base/v1/admin/users/$admin_id/topups" -H "$auth" \
    -H 'Content-Type: application/json' -d '{"amount":"1000.00","payment_id":"make-run-demo-app"}' || true
  agent_abs=$(cd "$(dirname "$agent")" && pwd)/$(basename "$agent")
  app_body='{"slug":"echo","name":"Echo (sim)","description":"An OpenAI-compatible echo model on the simulated fleet",
    "image":"rocm/pytorch:2.3-rocm6.2","gpu_type":"MI450","port":18000,
    "command":["AGENT","sim-model-server","--port","18000"],"min_replicas":0,"max_replicas":2,
    "concurrency_target":4,"idle_seconds":300,"price_per_request":"0.001",
    "price_per_1k_input_tokens":"0.002","price_per_1k_output_tokens":"0.004"}'
  status=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$base/v1/apps" -H "$auth" \
    -H 'Content-Type: application/json' -d "${app_body/AGENT/$agent_abs}" || true)
  case $status in
    201|409) demo_app="echo" ;;
    *) echo "run-local: publishing the demo app failed (HTTP $status)" >&2 ;;
  esac
fi

cat <<EOF

==============================================================================
 gpurent is running at $base   (database $db)
==============================================================================
EOF
if [ -n "$new_key" ]; then
  echo " A new database: its first admin is admin@localhost. Its API key, shown"
  echo " this once (also saved in $key_file, mode 0600):"
  echo
  echo "   $new_key"
elif [ -n "$made_key" ]; then
  echo " $key_file was missing, so a new admin ($made_key) was made;"
  echo " its API key is saved in $key_file (mode 0600)."
elif [ -n "$admin_key" ]; then
  echo " The admin API key from the first run is in $key_file."
else
  cat <<EOF
 $key_file is missing (the admin key is printed only when the database is
 created). Make another admin key, even while gpurentd runs, with:
   $gpurentd admin create-user --db $db --email you@example.com --admin
 or start from scratch: stop this, 'rm -rf $var', 'make run'.
EOF
fi
if [ ${#fleet_pids[@]} -gt 0 ]; then
  echo
  echo " Simulated fleet (logs in $fleet_dir/*.log):"
  for f in "${fleets[@]}"; do
    set -- $f
    # "fleet ready: 4 nodes (4 registered, 0 kept, 0 failed); ..."
    line=$(sed -n 's/^fleet ready: .*(\(.*\)).*/\1/p' "$fleet_dir/$1.log" 2>/dev/null | tail -n 1 || true)
    printf '   %-9s %s x %s cards  %-9s 127.0.0.1:%-6s %s\n' "$2" "$3" "$4" "$5" "$6" \
      "${line:-not ready, see $fleet_dir/$1.log}"
  done
  if [ "$fleet_failed" = 1 ]; then
    cat <<EOF
 Some nodes did not come up (see above). A node registered by an earlier run
 whose secret is gone from $fleet_dir cannot answer; start afresh with
 'rm -rf $var' (the database and the fleet go together).
EOF
  fi
fi
cat <<EOF

 The web console: open $base/ in a browser (sign up with the invite code
 AMD6GW; the verification code is in this terminal's log).

 Or try the API (in another terminal; add '| python3 -m json.tool' to pretty-print):

   API=$base

   # the GPU catalog: cards in total and free now, price per card-hour
   curl -s \$API/v1/gpu-types

   # sign up with the invite code AMD6GW (10 yuan of credit once your e-mail
   # address is verified, below); the reply holds
   # your API key ("token"), shown once
   KEY=\$(curl -s -X POST \$API/v1/signup \\
        --json '{"email":"ada@example.com","password":"correct horse battery","invite_code":"AMD6GW"}' \\
        | grep -o 'gpk_[a-z0-9_]*')
   # (signed up in an earlier run? log in instead: every login makes a new key)
   # KEY=\$(curl -s -X POST \$API/v1/login \\
   #      --json '{"email":"ada@example.com","password":"correct horse battery"}' | grep -o 'gpk_[a-z0-9_]*')

   # verify the address: with no smtp_url set, gpurentd does not send the
   # e-mail but writes it to its log in this terminal, on a line starting
   # "E-MAIL NOT SENT (no smtp_url): verify ada@example.com with code evc_..."
   # (the credit comes, and launching is allowed, once the address is verified)
   curl -s -X POST \$API/v1/verify-email --json '{"token":"evc_...the code from the log..."}'

   # launch 8 x MI450 (1.20 per card-hour: 9.60 an hour) with ROCm PyTorch;
   # your /shared volume is made on first use
   ID=\$(curl -s -X POST \$API/v1/instances -H "Authorization: Bearer \$KEY" \\
        --json '{"gpu_type":"MI450","card_count":8,"image":"rocm/pytorch:2.3-rocm6.2"}' \\
        | grep -o 'ins_[a-z0-9]*' | head -n 1)

   # watch it go pending, provisioning (pulling, mounting), running: a few
   # seconds on the simulated fleet
   curl -s \$API/v1/instances/\$ID -H "Authorization: Bearer \$KEY"
   curl -s \$API/v1/instances/\$ID/events -H "Authorization: Bearer \$KEY"

   # your SSH key (make one with ssh-keygen -t ed25519 if you have none);
   # the account's keys reach its instances, running ones too, within moments
   curl -s -X POST \$API/v1/ssh-keys -H "Authorization: Bearer \$KEY" \\
        --json "{\\"name\\":\\"laptop\\",\\"public_key\\":\\"\$(cat ~/.ssh/id_ed25519.pub)\\"}"
   # then take an OpenSSH config and the host keys for every rank, and go
   # in: a shell in the workload, a file into /shared, and what the
   # container printed
   curl -s \$API/v1/instances/\$ID/ssh-config -H "Authorization: Bearer \$KEY" > gpurent.ssh
   curl -s \$API/v1/instances/\$ID -H "Authorization: Bearer \$KEY" \\
        | python3 -c 'import json,sys; [print(n["ssh"]["known_hosts"]) for n in json.load(sys.stdin)["nodes"]]' \\
        > gpurent.known_hosts
   ssh -F gpurent.ssh -o UserKnownHostsFile=gpurent.known_hosts \$ID-0 'pwd; ls'
   scp -F gpurent.ssh -o UserKnownHostsFile=gpurent.known_hosts README.md \$ID-0:/shared/
   # what the container printed (add &follow=true and curl -N to follow it)
   curl -s "\$API/v1/instances/\$ID/logs?tail=50" -H "Authorization: Bearer \$KEY"
   # (the simulated runtime runs your shell in a directory of the host, with
   # /shared as ./shared: it is for trying and testing, not isolation)

   # stop it: billing ends at once, the volume stays; start it again with
   # POST .../start, remove it with DELETE \$API/v1/instances/\$ID
   curl -s -X POST \$API/v1/instances/\$ID/stop -H "Authorization: Bearer \$KEY"

   # what it cost (the final charge is posted by the next billing pass,
   # within 10 seconds)
   curl -s \$API/v1/balance -H "Authorization: Bearer \$KEY"
   curl -s \$API/v1/usage -H "Authorization: Bearer \$KEY"
   curl -s \$API/v1/transactions -H "Authorization: Bearer \$KEY"
EOF
if [ -n "$admin_key" ]; then
  cat <<EOF

   # as the admin: the nodes, their states and cards; the metrics
   curl -s \$API/v1/admin/nodes -H "Authorization: Bearer \$(cat $key_file)"
   curl -s \$API/metrics -H "Authorization: Bearer \$(cat $key_file)"
EOF
fi
cat <<EOF

EOF
if [ -n "$demo_app" ]; then
  cat <<EOF

   # the marketplace: the demo app "echo" behind gpurent-gateway on port $gw_port
   # (the first call waits while a replica starts from zero); any user's key
   curl -s \$API/v1/apps
   curl -s http://127.0.0.1:$gw_port/apps/echo/v1/chat/completions -H "Authorization: Bearer \$KEY" \\
        --json '{"messages":[{"role":"user","content":"hello from the marketplace"}]}'
   curl -sN http://127.0.0.1:$gw_port/apps/echo/v1/chat/completions -H "Authorization: Bearer \$KEY" \\
        --json '{"messages":[{"role":"user","content":"streamed word by word"}],"stream":true}'
EOF
fi
cat <<EOF

   # the API (OpenAPI 3), and whether the server is up
   curl -s \$API/v1/openapi.json
   curl -s \$API/healthz

 Ctrl-C stops gpurentd${fleet_pids[0]:+ and the fleet}, as does '$stop_command' in another
 terminal; the data stays in $var/ for the next 'make run' ('rm -rf $var' starts afresh).
==============================================================================

EOF

finish
