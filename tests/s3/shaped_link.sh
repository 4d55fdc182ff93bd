# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# A link with a rate to a store, for the store benches. On loopback a
# store shares this machine's CPUs and no link limits it, so it shows
# nothing of a real link, where an upload is bound by the network. Here
# the store runs in a network namespace joined to this one by a veth pair
# whose two ends a token bucket (tbf) limits, one per direction. (This
# machine's kernel has no netem: no delay.) Needs root (ip, tc). Sourced.
#   shaped_link_up RATE   e.g. 1gbit; sets SHAPED_NS (the namespace) and
#                         SHAPED_IP (its address)
#   shaped_link_down
shaped_link_up() {
	local rate=$1 id=$$ a b
	# a /30 of 10.200.0.0/16 from the PID: runs side by side differ
	a=$(((id / 64) % 250 + 1))
	b=$(((id % 64) * 4))
	SHAPED_NS=ckfs-link-$id
	SHAPED_HOST=ckl${id}h
	SHAPED_IP=10.200.$a.$((b + 2))
	ip netns add "$SHAPED_NS" &&
		ip link add "$SHAPED_HOST" type veth peer name ckl${id}n netns "$SHAPED_NS" &&
		ip addr add "10.200.$a.$((b + 1))/30" dev "$SHAPED_HOST" &&
		ip link set "$SHAPED_HOST" up &&
		ip -n "$SHAPED_NS" addr add "$SHAPED_IP/30" dev "ckl${id}n" &&
		ip -n "$SHAPED_NS" link set "ckl${id}n" up &&
		ip -n "$SHAPED_NS" link set lo up &&
		tc qdisc add dev "$SHAPED_HOST" root tbf rate "$rate" burst 1mb latency 100ms &&
		ip netns exec "$SHAPED_NS" tc qdisc add dev "ckl${id}n" root tbf rate "$rate" \
			burst 1mb latency 100ms || {
		shaped_link_down
		return 1
	}
}

shaped_link_down() {
	[ -n "${SHAPED_NS:-}" ] || return 0
	ip link del "$SHAPED_HOST" 2>/dev/null # takes its peer with it
	ip netns del "$SHAPED_NS" 2>/dev/null
	SHAPED_NS=
}
