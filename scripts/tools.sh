#!/usr/bin/env bash
# tools.sh makes sure the tools that check deploy/ are installed: podman and
# buildah (the image), promtool (the Prometheus rules, from Debian's
# prometheus package) and systemd-analyze (the unit); and Debian's
# python3-grpcio and python3-protobuf, for /usr/bin/python3, which the
# gRPC tests of idem serve run a Python server and client with. Run it as root; it
# installs what is missing with apt-get, is idempotent, and is quick when
# everything is there. It prints progress on stderr and exits 1 when a tool
# could not be installed (its tests then skip, or fail when CI=true).
set -uo pipefail

log() { echo "tools.sh: $*" >&2; }

missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
/usr/bin/python3 -c 'import grpc, google.protobuf' >/dev/null 2>&1 || missing+=(python3-grpcio python3-protobuf)
if [ "${#missing[@]}" = 0 ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	log "need to install ${missing[*]}, but not running as root"
	exit 1
fi
log "apt-get update"
apt-get update -qq || exit 1
log "apt-get install ${missing[*]}"
# policy-rc.d keeps the prometheus package from starting a server of its own.
if [ ! -e /usr/sbin/policy-rc.d ]; then
	printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
	chmod +x /usr/sbin/policy-rc.d
	trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" uidmap fuse-overlayfs >&2 || exit 1
