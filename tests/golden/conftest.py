from tests.support.stores import clock, store, stores

__all__ = ["clock", "store", "stores"]
