#!/bin/bash
# The broker: server.properties from the KAFKA_* variables (the way apache/kafka reads them), the
# log directory formatted with CLUSTER_ID unless it is already, then Kafka in the foreground with
# the command line `flowstream dev-kafka` uses (broker.args, storage.args).
set -euo pipefail

home=/opt/kafka
config=$home/config/server.properties
: "${CLUSTER_ID:?set CLUSTER_ID to a base64url-encoded 16-byte id}"
# Variables of the JVM, not settings of the broker.
not_settings=" KAFKA_HEAP_OPTS KAFKA_JVM_PERFORMANCE_OPTS KAFKA_OPTS KAFKA_LOG4J_OPTS "

: >"$config"
for name in $(compgen -e); do
    [[ $name == KAFKA_* && $not_settings != *" $name "* ]] || continue
    key=${name#KAFKA_}
    key=${key,,}
    key=${key//___/-}
    key=${key//__/%}
    key=${key//_/.}
    key=${key//%/_}
    printf '%s=%s\n' "$key" "${!name}" >>"$config"
done
grep -q '^log.dirs=' "$config" || echo "log.dirs=/var/lib/kafka/data" >>"$config"

mapfile -t storage <"$home/storage.args"
mapfile -t broker <"$home/broker.args"
for i in "${!storage[@]}"; do
    [[ ${storage[$i]} == @CLUSTER_ID@ ]] && storage[$i]=$CLUSTER_ID
done
"${storage[@]}" --ignore-formatted
run=()
for word in "${broker[@]}"; do
    # KAFKA_HEAP_OPTS, a list of JVM options, goes after the launcher's: the last -Xmx wins.
    # shellcheck disable=SC2206
    [[ $word == kafka.Kafka ]] && run+=(${KAFKA_HEAP_OPTS:-})
    run+=("$word")
done
exec "${run[@]}"
