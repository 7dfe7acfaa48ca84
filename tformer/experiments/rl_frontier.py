"""The frontiers of ``python -m tformer rl`` (``tformer.experiments.rl``): a method's rate
against its KL per line pooled over seeds, a bootstrap clustered by prompt, and GRPO's rate read
at the KL of DPO's runs and of best-of-n (matched KL) and at fixed KL budgets."""
import numpy as np

from tformer.experiments import preference as PF
from tformer.experiments.rl_judged import best_of_n_kl, pass_at

BUDGETS = (0.5, 1, 2, 5, 10)                # KL per line at which the frontiers are read


# --- the analysis -----------------------------------------------------------------------------------

def _per_prompt(points, key):
    """(S, M) array of one point's per-prompt values over the seeds ``points`` (one per seed)."""
    return np.array([p["per_prompt"][key] for p in points], dtype=np.float64)


class Bootstrap:
    """Shared draws: ``W (B, M)`` prompt counts (each prompt a cluster), and per method its seed
    draws ``(B, S)``."""

    def __init__(self, M, B, seed=0):
        self.rng = np.random.default_rng(seed)
        self.W = self.rng.multinomial(M, np.full(M, 1 / M), size=B).astype(np.float64)   # (B, M)
        self.M, self.B, self._seeds = M, B, {}

    def seeds(self, method, S):
        if method not in self._seeds:
            self._seeds[method] = self.rng.integers(0, S, (self.B, S))
        return self._seeds[method]

    def pooled(self, method, values, per_line):
        """Replicates (B,) of Σ over resampled seeds and prompts of ``values (S, M)`` divided by
        the lines they hold, ``per_line`` lines per prompt."""
        S = values.shape[0]
        by_seed = self.W @ values.T                                          # (B, S)
        idx = self.seeds(method, S)
        return np.take_along_axis(by_seed, idx, axis=1).sum(1) / (S * self.M * per_line)


def _finite(x):
    """``x`` rounded, or None where it is not a number (JSON has no NaN)."""
    return round(float(x), 5) if np.isfinite(x) else None


def _interval(point, reps):
    """``[point, low, high]``: the 95 % percentile interval of the finite replicates (None if none)."""
    reps = reps[np.isfinite(reps)]
    lo, hi = (np.percentile(reps, [2.5, 97.5]) if reps.size else (np.nan, np.nan))
    return [_finite(point), _finite(lo), _finite(hi)]


def frontier(method, runs, base, boot, samples):
    """The method's points pooled over seeds: rate (both judges), KL, nats/char, with intervals;
    and the bootstrap replicates kept for the matched-KL comparisons."""
    steps = [p["step"] for p in runs[0]["points"]]
    reps = {0: {key: boot.pooled("base", _per_prompt([base], pp), samples)
                for key, pp in (("rate", "scans"), ("rate_strict", "scans_strict"),
                                ("kl_per_line", "kl"))}}
    rows = [{"step": 0, **{key: _interval(base[key], reps[0][key])
                           for key in ("rate", "rate_strict", "kl_per_line")},
             "val_nats_per_char": [base["val_nats_per_char"]] * 3}]
    for i, step in enumerate(steps):
        pts = [r["points"][i] for r in runs]
        row, rep = {"step": step}, {}
        for key, pp in (("rate", "scans"), ("rate_strict", "scans_strict"), ("kl_per_line", "kl")):
            values = _per_prompt(pts, pp)
            point = values.sum() / values.size / samples
            rep[key] = boot.pooled(method, values, samples)
            row[key] = _interval(point, rep[key])
            row[key + "_seeds_t"] = PF.t_interval([p[key] for p in pts])
        row["val_nats_per_char"] = PF.t_interval([p["val_nats_per_char"] for p in pts])
        rows.append(row)
        reps[step] = rep
    return rows, reps


def read_at(kls, rates, target):
    """The rate on the frontier (points ``kls``, ``rates``, linear between them, sorted by KL) at
    KL ``target``; NaN past its last point."""
    order = np.argsort(kls)
    kls, rates = np.asarray(kls)[order], np.asarray(rates)[order]
    return float(np.interp(target, kls, rates)) if target <= kls[-1] else float("nan")


def best_within(kls, rates, target):
    """The best rate among the frontier's points of KL ≤ ``target`` (the base's, KL 0, is one)."""
    return max(r for k, r in zip(kls, rates) if k <= target)


def matched(grpo_rows, grpo_reps, target_rows, target_reps, key):
    """GRPO's rate ``key`` at the KL of the target's point, minus the target's, and GRPO's best
    rate within that KL, minus the target's: each with its interval."""
    steps = sorted(grpo_reps)
    out = {}
    for name, read in (("grpo_minus_other", read_at), ("grpo_best_within_minus_other", best_within)):
        point = read([r["kl_per_line"][0] for r in grpo_rows], [r[key][0] for r in grpo_rows],
                     target_rows["kl_per_line"][0]) - target_rows[key][0]
        reps = np.array([read([grpo_reps[s]["kl_per_line"][b] for s in steps],
                              [grpo_reps[s][key][b] for s in steps], target_reps["kl_per_line"][b])
                         - target_reps[key][b] for b in range(len(target_reps[key]))])
        out[name] = _interval(point, reps)
        if read is read_at:
            out["reached"] = float(np.isfinite(reps).mean())
    return out


def analyse(result, bootstrap, targets):
    """Frontiers, GRPO's rate at the KL of each run of ``targets`` (method names) and of
    best-of-n, the budgets."""
    runs = result.get("runs", {})
    base, samples = result["base"], result["config"]["eval_samples"]
    boot = Bootstrap(len(base["per_prompt"]["scans"]), bootstrap)
    seeds = result["config"]["seeds"]
    done = {m: [rs[str(s)] for s in seeds] for m, rs in runs.items()
            if all(str(s) in rs for s in seeds)}
    out = {"frontiers": {}, "matched_kl": {}, "budgets": {}}
    reps = {}
    for method, rs in done.items():
        out["frontiers"][method], reps[method] = frontier(method, rs, base, boot, samples)
    if "grpo" in done:
        g_rows, g_reps = out["frontiers"]["grpo"], reps["grpo"]
        for method in targets:
            if method in done:
                last = out["frontiers"][method][-1]
                out["matched_kl"][method] = {
                    "kl_per_line": last["kl_per_line"],
                    **{key: matched(g_rows, g_reps, last, reps[method][last["step"]], key)
                       for key in ("rate", "rate_strict")}}
        bo = result.get("best_of")
        if bo:
            W = boot.W
            for judge, key, pp in (("lenient", "rate", "scans"), ("strict", "rate_strict",
                                                                    "scans_strict")):
                k = np.array(bo["per_prompt"][pp], dtype=np.float64)
                m = bo["samples_per_prompt"]
                for n, row in bo["by"][judge].items():
                    rate, kl = pass_at(int(n), k, m), best_of_n_kl(k / m, int(n))
                    target = {"kl_per_line": [row["kl_per_line"]], key: [row["rate"]]}
                    target_reps = {"kl_per_line": W @ kl / boot.M, key: W @ rate / boot.M}
                    out["matched_kl"][f"best-of-{n} ({judge})"] = {
                        "kl_per_line": row["kl_per_line"],
                        key: matched(g_rows, g_reps, target, target_reps, key)}
    for method, rows in out["frontiers"].items():
        out["budgets"][method] = {str(b): {key: _finite(read_at([r["kl_per_line"][0] for r in rows],
                                                                [r[key][0] for r in rows], b))
                                           for key in ("rate", "rate_strict")} for b in BUDGETS}
    return out
