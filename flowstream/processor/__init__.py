"""The Kafka stream processor: partitions, the loop, metrics."""
