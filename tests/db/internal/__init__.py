"""Tests of internal contracts: they import Leasing's internal modules (the claim's SQL, the
console's read model, the worker's parts) by design, and change when those do. Everything
else in the tiers goes through the public API."""
