"""``ProcessorGauges``: the gauges a scrape reads off a processor's state, at scrape time.

* ``flowstream_runs{status}``: the runs of the partitions this member owns and has restored, by
  status. Each partition store keeps its counts as events are appended (``stores.statuses``), so
  a scrape adds a few numbers per partition and never reads a run.
* ``flowstream_consumer_lag{topic,partition}``: records of each owned command partition that
  the processor has not consumed yet: the high watermark librdkafka cached from its last fetch
  response, minus the consumer's position (librdkafka's, which moves past transaction markers:
  the processor's own applied offsets stop before them; before anything is consumed, the
  position the processor resumes from). No call reaches a broker: the consumer fetches ahead on
  its own threads, so the figure keeps moving even while the processor's loop is busy. A
  partition not fetched since it was assigned (still restoring) has no watermark yet and no
  sample. Records consumed but held for the next iteration (a decision budget's rest, at most a
  poll's 500) are not counted.

Both are read from the metrics server's thread: each reads plain numbers (copied dicts) and
librdkafka calls that are safe from any thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from flowstream.kafka import clients
from flowstream.model.snapshot import RunStatus

if TYPE_CHECKING:
    from flowstream.processor.worker import Processor

__all__ = ["ProcessorGauges"]


class ProcessorGauges(Collector):
    """Runs by status and consumer lag per partition of one processor."""

    def __init__(self, processor: Processor) -> None:
        self.processor = processor

    def collect(self) -> Iterator[GaugeMetricFamily]:
        runs = GaugeMetricFamily(
            "flowstream_runs",
            "Runs of the partitions owned and restored here, by status",
            labels=["status"],
        )
        for status, count in sorted(self.runs_by_status().items()):
            runs.add_metric([status], count)
        yield runs
        lag = GaugeMetricFamily(
            "flowstream_consumer_lag",
            "Records of an owned command partition not applied yet (cached high watermark "
            "minus the processor's position)",
            labels=["topic", "partition"],
        )
        for topic, partition, behind in self.lag():
            lag.add_metric([topic, str(partition)], behind)
        yield lag

    def runs_by_status(self) -> dict[str, int]:
        totals = dict.fromkeys((status.value for status in RunStatus), 0)
        for task in list(self.processor.tasks.owned.values()):
            if task.restoring:
                continue
            for status, count in task.store.status_counts().items():
                totals[status] = totals.get(status, 0) + count
        return totals

    def lag(self) -> list[tuple[str, int, int]]:
        consumer: Any = self.processor.consumer
        if consumer is None:
            return []
        owned = [
            (topic, task.partition, resume)
            for task in list(self.processor.tasks.owned.values())
            for topic, resume in sorted(dict(task.positions).items())
        ]
        wanted = [clients.TopicPartition(topic, partition) for topic, partition, _ in owned]
        try:
            consumed = {(tp.topic, tp.partition): tp.offset for tp in consumer.position(wanted)}
        except (clients.KafkaException, RuntimeError):  # closed meanwhile
            return []
        found = []
        for topic, partition, resume in owned:
            try:
                where = clients.TopicPartition(topic, partition)
                low, high = consumer.get_watermark_offsets(where, cached=True)
            except (clients.KafkaException, RuntimeError):  # unknown here, or closed
                continue
            if high < 0:
                continue  # not fetched yet
            position = consumed.get((topic, partition), -1)
            if position < 0:
                position = resume  # nothing consumed since the assignment
            found.append((topic, partition, max(0, high - max(position, low))))
        return found
