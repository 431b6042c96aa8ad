"""The Planner actor: load and throughput (SLA) scaling, its perf model and load predictors."""
