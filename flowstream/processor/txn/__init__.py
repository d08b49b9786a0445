"""The transaction pipeline: two transactional producers taking turns, a declared state machine."""
