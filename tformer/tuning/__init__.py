"""Tuning on preferences: DPO's loss and backward, the tuning loop (DPO and SFT), and the preference pairs sampled from a model and scored by a judge.

- ``dpo``: the DPO loss, a sequence's log-probability, their gradients;
- ``tune``: DPO and SFT steps through the one model; ``pairs``: the pairs and the judge.
"""
