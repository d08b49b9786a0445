#!/bin/bash
# The compose file's broker healthcheck, under the path it has in apache/kafka (whose tool this
# image does not ship): sends the broker at --bootstrap-server an ApiVersions request (v0) and
# exits 0 when the answer carries the request's correlation id and no error.
set -euo pipefail

server=localhost:9092
while [ $# -gt 0 ]; do
    case $1 in
        --bootstrap-server) server=$2; shift 2 ;;
        *) shift ;;
    esac
done
exec 3<>"/dev/tcp/${server%:*}/${server##*:}"
# size 12 | api key 18 (ApiVersions) | version 0 | correlation id 1 | client id "hc"
printf '\x00\x00\x00\x0c\x00\x12\x00\x00\x00\x00\x00\x01\x00\x02hc' >&3
# size (4 bytes) | correlation id (4) | error code (2)
reply=$(timeout 5 head -c 10 <&3 | od -An -tx1 | tr -d ' \n')
if [[ ${reply:8:12} != 000000010000 ]]; then
    echo "the broker at $server did not answer ApiVersions (got ${reply:-nothing})" >&2
    exit 1
fi
echo "the broker at $server answers ApiVersions"
