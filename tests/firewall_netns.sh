#!/usr/bin/env bash
# Loads a docker-user.rules file into a host of network namespaces and probes it.
#
# Run with bash inside `unshare -rn` (this namespace plays the host):
#   PYTHON=python3 PORTS="8086 3100" READY_PORT=9999 firewall_netns.sh RULES CLIENT_ADDRESS...
# With HOLD_PORT=<port> HOLD_COUNT=<n>, the container keeps its connections on
# that port open, and the first client holds n of them open while it, then the
# second client, try one more; then it closes them and tries again. Prints
# "<client> holds <how many of n answered>", then "<client> <port> <what probe says>"
# for each try, in that order.
# The host has 10.0.0.20 on a bridge of clients, one namespace per client
# address, and a "container" at 172.18.0.2 behind a DNAT rule for every port of
# 10.0.0.20, as Docker publishes one (nat PREROUTING, then FORWARD through
# DOCKER-USER). Prints "<client> <port> <what probe says>" for each pair.
set -eu
rules="$1"
shift
pids=""
trap 'kill $pids 2>/dev/null' EXIT
spawn() { unshare -n sleep 600 >/dev/null 2>&1 & }
# Until the child has its own network namespace.
own() { while [ "$(readlink "/proc/$1/ns/net")" = "$(readlink /proc/self/ns/net)" ]; do sleep 0.01; done; }
in_ns() {
  pid="$1"
  shift
  nsenter -t "$pid" -n --preserve-credentials "$@"
}

ip link set lo up
spawn
container=$!
pids="$pids $container"
own "$container"
ip link add br0 type bridge
ip addr add 10.0.0.20/24 dev br0
ip link set br0 up
ip link add c-host type veth peer name eth0 netns "$container"
ip addr add 172.18.0.1/24 dev c-host
ip link set c-host up
in_ns "$container" sh -c 'ip link set lo up; ip addr add 172.18.0.2/24 dev eth0; ip link set eth0 up
  ip route add default via 172.18.0.1'
clients=""
for address in "$@"; do
  spawn
  pid=$!
  pids="$pids $pid"
  own "$pid"
  clients="$clients $pid:$address"
  ip link add "v$pid" type veth peer name eth0 netns "$pid"
  ip link set "v$pid" master br0 up
  in_ns "$pid" sh -c "ip link set lo up; ip addr add $address/24 dev eth0; ip link set eth0 up
    ip route add default via 10.0.0.20"
done
echo 1 >/proc/sys/net/ipv4/ip_forward
iptables-restore <<'RULES'
*nat
:PREROUTING ACCEPT [0:0]
-A PREROUTING -d 10.0.0.20/32 -p tcp -j DNAT --to-destination 172.18.0.2
COMMIT
*filter
:FORWARD ACCEPT [0:0]
:DOCKER-USER - [0:0]
-A FORWARD -j DOCKER-USER
-A FORWARD -j ACCEPT
COMMIT
RULES
iptables-restore --noflush "$rules"

# The container answers "ok" on every port; on HOLD_PORT it keeps the connection
# open until the client closes it, then closes its side (a connection left half
# closed would stay in conntrack's count for a minute). It ends after 600 s, as
# the namespaces' sleeps do, should this script be killed before its trap runs.
in_ns "$container" "$PYTHON" -c '
import socket, sys, threading
def close_at_eof(connection):
    with connection:
        while connection.recv(4096):
            pass
def serve(port, hold):
    listener = socket.create_server(("172.18.0.2", port), backlog=1024)
    while True:
        connection, _ = listener.accept()
        connection.sendall(b"ok")
        if hold:
            threading.Thread(target=close_at_eof, args=(connection,), daemon=True).start()
        else:
            connection.close()
hold_port = int(sys.argv[1])
for port in map(int, sys.argv[2:]):
    threading.Thread(target=serve, args=(port, port == hold_port), daemon=True).start()
threading.Event().wait(600)
' "${HOLD_PORT:-0}" $PORTS ${HOLD_PORT:-} "$READY_PORT" >/dev/null 2>&1 &
pids="$pids $!"

# "open" (the container answered), "dropped" (no answer within the deadline:
# what DROP does), or "error ..." (refused, unreachable: something else broke).
probe() {  # pid address port deadline
  in_ns "$1" "$PYTHON" -c '
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        print("open" if s.recv(2) == b"ok" else "error: no ok")
except TimeoutError:
    print("dropped")
except OSError as error:
    print("error:", error)' "$2" "$3" "$4"
}
# Ready once every client reaches the container through the host on a port
# the rules do not restrict (READY_PORT): links up, neighbours resolved.
for client in $clients; do
  tries=0
  until [ "$(probe "${client%%:*}" 10.0.0.20 "$READY_PORT" 1)" = open ]; do
    tries=$((tries + 1))
    [ "$tries" -lt 120 ] || { echo "${client#*:} never reaches the container" >&2; exit 1; }
    sleep 0.1
  done
done
# Every probe at once: a dropped connection takes the whole deadline.
for client in $clients; do
  pid=${client%%:*}
  address=${client#*:}
  for port in $PORTS; do
    (
      trap - EXIT
      echo "$address $port $(probe "$pid" 10.0.0.20 "$port" 10)"
    ) &
  done
done
for job in $(jobs -p); do
  case " $pids " in
    *" $job "*) ;;
    *) wait "$job" ;;
  esac
done

[ -n "${HOLD_PORT:-}" ] || exit 0
set -- $clients
holder=${1%%:*}
holder_address=${1#*:}
other=${2%%:*}
other_address=${2#*:}
# The holder keeps HOLD_COUNT connections open until its standard input closes.
coproc HOLDER {
  in_ns "$holder" "$PYTHON" -c '
import socket, sys
held = []
for _ in range(int(sys.argv[3])):
    try:
        s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
        if s.recv(2) == b"ok":
            held.append(s)
    except OSError:
        pass
print(len(held), flush=True)
sys.stdin.read()' 10.0.0.20 "$HOLD_PORT" "$HOLD_COUNT"
}
holder_pid=$HOLDER_PID # bash unsets HOLDER_PID once the coprocess has ended
holder_in=${HOLDER[1]}
read -r answered <&"${HOLDER[0]}"
echo "$holder_address holds $answered"
echo "$holder_address $HOLD_PORT $(probe "$holder" 10.0.0.20 "$HOLD_PORT" 10)"
echo "$other_address $HOLD_PORT $(probe "$other" 10.0.0.20 "$HOLD_PORT" 10)"
eval "exec ${holder_in}>&-"
wait "$holder_pid" || true
# Connections closed on both sides leave the count as their conntrack entries
# close; a few tries of 2 s each, 60 s at most.
for _ in $(seq 30); do
  again=$(probe "$holder" 10.0.0.20 "$HOLD_PORT" 2)
  [ "$again" = open ] && break
done
echo "$holder_address $HOLD_PORT $again"
