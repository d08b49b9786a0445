"""The error the development broker launcher raises."""

from __future__ import annotations

from flowstream.errors import FlowError

__all__ = ["DevKafkaError"]


class DevKafkaError(FlowError):
    """The local Kafka broker could not be fetched, started, reached or stopped.

    The message is one line that names the cause and, where there is one, the log file to read.
    """
