from tests.support.flows import flows, processor_pool
from tests.support.stores import clock, store, stores

__all__ = ["clock", "flows", "processor_pool", "store", "stores"]
