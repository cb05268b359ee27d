#!/usr/bin/env bash
# image-context.sh DIR BINARY fills DIR with what deploy/Containerfile
# copies: the static idem BINARY, the host's CA certificates, passwd and
# group files naming uid/gid 65532, and the empty data folder. DIR is
# emptied first.
set -euo pipefail
if [ "$#" != 2 ]; then
	echo "usage: $0 DIR BINARY" >&2
	exit 2
fi
dir=$1 bin=$2
certs=${CA_CERTIFICATES:-/etc/ssl/certs/ca-certificates.crt}
if [ ! -s "$certs" ]; then
	echo "image-context.sh: no CA certificates at $certs (apt-get install ca-certificates, or set CA_CERTIFICATES)" >&2
	exit 1
fi
rm -rf "$dir"
mkdir -p "$dir/data"
install -m 0755 "$bin" "$dir/idem"
install -m 0644 "$certs" "$dir/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/var/lib/idem:/sbin/nologin\n' >"$dir/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$dir/group"
chmod 0644 "$dir/passwd" "$dir/group"
chmod 0755 "$dir/data"
