"""flowstream: durable workflows over an event history, on Kafka or embedded RocksDB."""
