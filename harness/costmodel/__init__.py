"""The cost model: what decoding costs, read from the records that measured it, and what a step costs.

records: the one reader of every costs-record format (a worker's, the replay's, a batched worker's, the
calibration files); sequential: one sequence's costs and Leviathan et al.'s expected step; batched: several
sequences' costs and how llama.cpp splits their batch; price: a step's price by its shape (N sequences, the
sequential loop's a batch of one; the loop's overhead per verified row), and the predicted speedup; adaptive:
the per-step gamma controller. Pure: no engine, no files."""
from harness.costmodel.adaptive import AdaptiveGamma
from harness.costmodel.batched import BatchCosts, split
from harness.costmodel.price import Shape, Step, batch_ms, predicted_speedup, price
from harness.costmodel.records import CostRecord, at_context, calibrated, read, with_unit_costs
from harness.costmodel.sequential import Costs, beats_plain, best_gamma, best_speculative, expected_tokens

__all__ = ["AdaptiveGamma", "BatchCosts", "CostRecord", "Costs", "Step", "at_context", "batch_ms", "beats_plain",
           "best_gamma", "best_speculative", "calibrated", "expected_tokens", "predicted_speedup", "price", "read",
           "Shape", "split", "with_unit_costs"]
