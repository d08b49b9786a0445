"""Kafka plumbing: client factories (:mod:`.clients`, the one module that imports
``confluent_kafka``) and topic creation and verification (:mod:`.topics`)."""
