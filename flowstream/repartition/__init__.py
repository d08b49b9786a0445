"""Moving a Kafka deployment to another partition count (``flowstream kafka repartition``).

A run's partition is ``partition_for(run_id, count)``, so the count of the run-keyed topics
cannot change in place: the same topics with more partitions would put runs on partitions that
do not hold their histories. A move copies the deployment to topics under a new prefix with the
new count instead, and the processors of the new prefix restore from the copy:

1. **Check** (:mod:`.plan`): the old topics exist and are co-partitioned; the old processors'
   group has no member on them (stop or drain the old processors first: a move never races a
   live owner); the target prefix is empty, or is the target of this same move begun earlier
   (the move's group remembers it: then the move resumes). What the old writers left open is
   aborted, as a new owner's fence does (``processor.fence``), and the move waits until every
   old partition is stable.
2. **Copy** (:mod:`.pump`): the new events topic is created, and every record of the old one, read
   ``read_committed`` (aborted records and transaction markers skipped), is produced to the
   partition of its key under the new count (``anchor`` records, which have no key and no reader,
   are left out). Everything a run needs follows its history, because every record of the events
   topic is keyed by what owns it: a run's events, its parked commands (``inbox``) and their ends by
   run id; hook-token claims, waiters and releases by the token's digest, so each lands on the new
   partition of that digest and stays the one cluster-wide claim. Timers, steps in flight,
   children's and successors' links, quarantines are derived from the histories by the new owners'
   restore, as after any failover. A record keeps its key, value, timestamp (a parked command's
   time-to-live counts from it) and headers, and gains ``flowstream-copied-from:
   <topic>:<partition>:<offset>``. Records of one key were on one old partition and are copied in
   that partition's order, so each run's history keeps its order.
3. **Carry and forward the commands**: only then are the new command topics created (a
   processor refuses to start while a topic is missing, so none restores from a partial copy),
   and every command the old group had not applied (from its committed positions, which its
   transactions committed with their effects) is forwarded to the new partition of its key,
   then every command that still arrives on the old topics, until the move is told to stop
   (SIGINT/SIGTERM, or ``--forward-seconds``): clients and the old processors' last commands
   (timers fired, children's starts and resolutions, successors' starts, hook-token claims)
   switching late lose nothing. Start the processors of the new prefix as soon as forwarding
   begins. Commands sent to the new topics directly and forwarded ones may interleave, as
   commands of two clients do; each is applied once by the rules that make any redelivery
   harmless (a run id, a signal id, a hook's payload, a timer's id).
4. **Audit** (:mod:`.audit`): the old and the new topics are read back; every old record in the
   moved ranges is on the new topics exactly once, on its key's new partition, with the same
   content, in the same order per key, and before anything the new processors wrote for that
   key; every run's history on the new events topic has contiguous sequences. It counts the
   runs that ended and those still open.

Exactly once, and resumable. Every copy and forward is a consume-produce transaction of one
transactional producer (``<group>.repartition.<target prefix>``) that commits the positions of
the old partitions it read to the move's own consumer group (same name), with the move's mark
in each position's metadata. A move that stops at any point (a crash, an interrupt, a broker
lost) is resumed by running the same command again: its producer's initialisation aborts what
the stopped one left open, and the copy and the forwarding go on from the committed positions.
Nothing is ever copied twice or skipped.

Clients still on the old prefix: their commands are forwarded, and while the move forwards, every
``outcome`` record written on the new events topic is written back to the old one (on its key's old
partition, as a copy; the copies the move made, and every other kind, are not sent back), so a
client waiting there gets its answer. Dead letters stay on the old prefix: they name positions of
the old topics.
"""

from __future__ import annotations

from flowstream.repartition.plan import MoveError, MovePlan

__all__ = ["MoveError", "MovePlan"]
