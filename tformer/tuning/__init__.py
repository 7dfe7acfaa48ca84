"""Tuning on preferences: DPO's and GRPO's losses and backwards, the tuning loop (DPO and SFT), and the preference pairs sampled from a model and scored by a judge.

- ``dpo``: the DPO loss and its gradient; ``grpo``: the GRPO loss (group advantages, the clipped
  importance ratio, the k3 KL term, TRL's normalisations) and its gradient;
- ``tune``: DPO and SFT steps through the one model; ``pairs``: the pairs and the judge.
"""
