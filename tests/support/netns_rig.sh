#!/usr/bin/env bash
# The multi-host test rig (docs/multihost.md): N "hosts" on one machine, each a network
# namespace with one interface on a bridge, so that MPI ranks on different hosts talk over TCP
# through the kernel's network stack and nothing else (no shared memory between hosts). Needs
# root (or CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2.
#
#   netns_rig.sh up DIR N [SLOTS]   make N hosts; DIR receives the rig's files:
#                                     rig.env (RIG_ID, RIG_BRIDGE, RIG_LAUNCHER_ADDR),
#                                     hosts (one "name netns veth ip" line per host),
#                                     hostfile (Open MPI hostfile, SLOTS slots per host),
#                                     agent (the rsh agent below as one program: mpirun's
#                                     --mca plm_rsh_agent DIR/agent)
#   netns_rig.sh down DIR           remove the hosts, the bridge and every process still in them
#   netns_rig.sh agent HOST CMD...  the rsh agent for mpirun (plm_rsh_agent): runs CMD on HOST
#                                     as ssh would (the arguments joined, run by sh), with HOST
#                                     as its host name (a UTS namespace of its own)
#   netns_rig.sh run DIR HOST CMD.. the same, for a test
#   netns_rig.sh pids DIR HOST      the processes running on HOST
#   netns_rig.sh kill DIR HOST      SIGKILL every process on HOST (a host that dies)
#   netns_rig.sh freeze DIR HOST    SIGSTOP every process on HOST (a host that hangs)
#   netns_rig.sh thaw DIR HOST      SIGCONT them
#   netns_rig.sh cut DIR HOST       take HOST's link down (the bridge side of its veth)
#   netns_rig.sh heal DIR HOST      bring it back up
#   netns_rig.sh impair DIR HOST DELAY_MS JITTER_MS LOSS_PCT
#                                   delay, jitter and loss on HOST's link, both directions:
#                                     tc netem where the kernel has it; otherwise the link is
#                                     rebuilt through tests/support/link_relay (TAP devices and
#                                     a user-space relay that applies the same impairment);
#                                     HP_RIG_RELAY names the relay program
#   netns_rig.sh check              exit 0 when namespaces can be made here, else print why
#
# Host names are the hostfile's names (h0, h1, ...); the agent finds the namespace by name in
# the rig's hosts file, found through $HP_RIG_DIR (set it for mpirun), so one machine can run
# several rigs at once (ctest -j): namespaces, bridge and subnet are named by a rig id.
set -euo pipefail

die() { echo "netns_rig: $*" >&2; exit 1; }

check() {
    command -v ip >/dev/null 2>&1 || { echo "no 'ip' command (install iproute2: tools/install-deps.sh)"; return 1; }
    command -v unshare >/dev/null 2>&1 || { echo "no 'unshare' command (util-linux)"; return 1; }
    local probe="hpprobe$$"
    if ! ip netns add "$probe" 2>/dev/null; then
        echo "cannot create a network namespace (needs root or CAP_NET_ADMIN and CAP_SYS_ADMIN; running as uid $(id -u))"
        return 1
    fi
    local ok=0
    ip link add "${probe}a" type veth peer name "${probe}b" 2>/dev/null && ok=1
    ip link del "${probe}a" 2>/dev/null || true
    ip netns del "$probe" 2>/dev/null || true
    [ $ok = 1 ] || { echo "cannot create a veth pair (kernel without CONFIG_VETH?)"; return 1; }
    return 0
}

# host NAME -> "netns veth ip" from DIR/hosts
lookup() {
    local dir=$1 host=$2
    [ -f "$dir/hosts" ] || die "no rig in '$dir' (run: netns_rig.sh up DIR N)"
    local line
    line=$(awk -v h="$host" '$1 == h { print $2, $3, $4 }' "$dir/hosts")
    [ -n "$line" ] || die "unknown host '$host' in rig '$dir' (hosts: $(awk '{printf "%s ", $1}' "$dir/hosts"))"
    echo "$line"
}

up() {
    local dir=$1 n=$2 slots=${3:-1}
    [ "$n" -ge 1 ] && [ "$n" -le 16 ] || die "up: expected 1..16 hosts, got '$n'"
    mkdir -p "$dir"
    local why
    why=$(check) || die "cannot make the rig here: $why"
    # a rig id unique on this machine while the rig lives: the smallest free one
    local id=""
    for i in $(seq 1 250); do
        if ! ip link show "hpb$i" >/dev/null 2>&1 && mkdir "/tmp/hp_rig_lock_$i" 2>/dev/null; then id=$i; break; fi
    done
    [ -n "$id" ] || die "up: no free rig id (250 rigs in use?)"
    local br="hpb$id" net="10.231.$id"
    ip link add "$br" type bridge
    ip link set "$br" up
    ip addr add "$net.254/24" dev "$br"
    : >"$dir/hosts"
    : >"$dir/hostfile"
    for h in $(seq 0 $((n - 1))); do
        local ns="hp${id}h$h" veth="hp${id}v$h" ip="$net.$((h + 1))"
        ip netns add "$ns"
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" master "$br"
        ip link set "$veth" up
        ip -n "$ns" addr add "$ip/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        ip -n "$ns" route add default via "$net.254" 2>/dev/null || true
        echo "h$h $ns $veth $ip" >>"$dir/hosts"
        echo "h$h slots=$slots" >>"$dir/hostfile"
    done
    cat >"$dir/rig.env" <<EOF
RIG_ID=$id
RIG_BRIDGE=$br
RIG_NET=$net.0/24
RIG_LAUNCHER_ADDR=$net.254
EOF
    # the agent for mpirun's plm_rsh_agent and hp-train's --launch-agent: one path, no
    # arguments (Open MPI reads ':' in plm_rsh_agent as "or", so no "script agent" there)
    local self
    self=$(readlink -f "$0")
    printf '#!/bin/sh\nHP_RIG_DIR=%s exec %s agent "$@"\n' "$(readlink -f "$dir")" "$self" >"$dir/agent"
    chmod +x "$dir/agent"
}

procs_in() {   # pids whose network namespace is ns
    local ns=$1
    ip netns pids "$ns" 2>/dev/null || true
}

down() {
    local dir=$1
    [ -f "$dir/rig.env" ] || return 0
    # shellcheck disable=SC1091
    . "$dir/rig.env"
    while read -r name ns veth ip; do
        local pids
        pids=$(procs_in "$ns")
        [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
        [ -f "$dir/relay.$name.pid" ] && kill -KILL "$(cat "$dir/relay.$name.pid")" 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
        ip link del "$veth" 2>/dev/null || true
        ip link del "hp${RIG_ID}t$name" 2>/dev/null || true
    done <"$dir/hosts"
    ip link del "$RIG_BRIDGE" 2>/dev/null || true
    rmdir "/tmp/hp_rig_lock_$RIG_ID" 2>/dev/null || true
    rm -f "$dir/rig.env"
}

agent_run() {   # dir host cmd...
    local dir=$1 host=$2
    shift 2
    local f
    f=$(lookup "$dir" "$host")
    set -- "$host" $f "$@"
    local name=$1 ns=$2
    shift 4
    # as ssh: the remote side runs the words joined by spaces under a shell
    exec ip netns exec "$ns" unshare --uts sh -c "hostname $name && $*"
}

impair() {
    local dir=$1 host=$2 delay=$3 jitter=$4 loss=$5
    read -r ns veth ip <<<"$(lookup "$dir" "$host")"
    # shellcheck disable=SC1091
    . "$dir/rig.env"
    if ip -n "$ns" link show eth0 type veth >/dev/null 2>&1 &&
        tc -n "$ns" qdisc add dev eth0 root netem delay "${delay}ms" "${jitter}ms" loss "${loss}%" 2>/dev/null; then
        tc qdisc add dev "$veth" root netem delay "${delay}ms" "${jitter}ms" loss "${loss}%"
        echo "netem"
        return 0
    fi
    # No sch_netem in this kernel: replace the veth by two TAP devices joined by the relay.
    local relay=${HP_RIG_RELAY:-}
    [ -n "$relay" ] && [ -x "$relay" ] || die "impair: the kernel has no netem and HP_RIG_RELAY does not name the link_relay program"
    [ -f "$dir/relay.$host.pid" ] && kill -KILL "$(cat "$dir/relay.$host.pid")" 2>/dev/null || true
    ip link del "$veth" 2>/dev/null || true   # removes eth0 in the namespace with it
    ip -n "$ns" link del eth0 2>/dev/null || true
    local tap="hp${RIG_ID}t$host"
    "$relay" --netns "$ns" --inner eth0 --outer "$tap" --delay-ms "$delay" --jitter-ms "$jitter" \
        --loss-pct "$loss" --pidfile "$dir/relay.$host.pid" --daemon
    ip link set "$tap" master "$RIG_BRIDGE"
    ip link set "$tap" up
    ip -n "$ns" addr add "$ip/24" dev eth0
    ip -n "$ns" link set eth0 up
    # record the outer device as the host's link (cut / heal act on it)
    awk -v h="$host" -v t="$tap" '$1 == h { $3 = t } { print }' "$dir/hosts" >"$dir/hosts.new"
    mv "$dir/hosts.new" "$dir/hosts"
    echo "relay"
}

cmd=${1:-}
shift || true
case "$cmd" in
check) check ;;
up) [ $# -ge 2 ] || die "usage: up DIR N [SLOTS]"; up "$@" ;;
down) [ $# -ge 1 ] || die "usage: down DIR"; down "$1" ;;
agent)
    [ -n "${HP_RIG_DIR:-}" ] || die "agent: HP_RIG_DIR is not set (the rig's folder)"
    [ $# -ge 2 ] || die "usage: agent HOST CMD..."
    agent_run "$HP_RIG_DIR" "$@" ;;
run) [ $# -ge 3 ] || die "usage: run DIR HOST CMD..."; agent_run "$@" ;;
pids) read -r ns _ _ <<<"$(lookup "$1" "$2")"; procs_in "$ns" ;;
kill | freeze | thaw)
    read -r ns _ _ <<<"$(lookup "$1" "$2")"
    sig=KILL
    [ "$cmd" = freeze ] && sig=STOP
    [ "$cmd" = thaw ] && sig=CONT
    pids=$(procs_in "$ns")
    [ -n "$pids" ] && kill -$sig $pids 2>/dev/null || true ;;
cut) read -r _ veth _ <<<"$(lookup "$1" "$2")"; ip link set "$veth" down ;;
heal) read -r _ veth _ <<<"$(lookup "$1" "$2")"; ip link set "$veth" up ;;
impair) [ $# -eq 5 ] || die "usage: impair DIR HOST DELAY_MS JITTER_MS LOSS_PCT"; impair "$@" ;;
*) die "unknown command '$cmd' (up, down, agent, run, pids, kill, freeze, thaw, cut, heal, impair, check)" ;;
esac
