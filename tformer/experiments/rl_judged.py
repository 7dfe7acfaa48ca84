"""What ``python -m tformer rl`` measures of a policy (``tformer.experiments.rl``): its lines
under both judges (the lenient ``meter.scans`` and the strict ``strict_meter.scans_strict``),
its KL per line from the reference, its validation loss; and best-of-n's rate and exact KL from the
base's own lines."""
import math
import time

import numpy as np

from tformer.experiments import preference as PF
from tformer.fast.losses import bernoulli_kl
from tformer.tuning import pairs as PR


# --- the judges --------------------------------------------------------------------

def strict_judge():
    from tformer.data.strict_meter import scans_strict
    return scans_strict


def judged_by(judge, tokenizer, responses, lengths):
    """``(M, n)`` bool: ``judge`` on each response's line (``responses: (M, n, R)``)."""
    M, n, _ = responses.shape
    flat, lens = responses.reshape(M * n, -1), lengths.reshape(-1)
    return np.array([bool(judge(PR.line_of(tokenizer, r[:k]))) for r, k in zip(flat, lens)]
                    ).reshape(M, n)


def evaluate(model, ref, tokenizer, eval_ids, windows, samples, step, kl=True):
    """One point of a frontier: ``samples`` lines per evaluation prompt (seed 3, the Preference
    chapter's draws), their rate under both judges, KL per line, nats/char, per prompt too."""
    t0 = time.perf_counter()
    resp, lens, lenient = PF.draw(model, tokenizer, eval_ids, samples, seed=3)
    strict = judged_by(strict_judge(), tokenizer, resp, lens)
    M = eval_ids.shape[0]
    kls = (PF.kl_per_line(model, ref, eval_ids, resp, lens).reshape(M, samples) if kl
           else np.zeros((M, samples)))
    show = min(PF.SHOW, M)
    return {"step": step, "rate": float(lenient.mean()), "rate_strict": float(strict.mean()),
            "kl_per_line": float(kls.mean()),
            "val_nats_per_char": PF.nats_per_char(model, windows),
            "mean_tokens": float(lens.mean()),
            "per_prompt": {"scans": lenient.sum(1).tolist(), "scans_strict": strict.sum(1).tolist(),
                           "kl": [round(float(v), 5) for v in kls.sum(1)]},
            "samples": [PR.line_of(tokenizer, resp[i, 0, :lens[i, 0]]) for i in range(show)],
            "samples_scan": [bool(lenient[i, 0]) for i in range(show)],
            "samples_scan_strict": [bool(strict[i, 0]) for i in range(show)],
            "seconds": time.perf_counter() - t0}


# --- best-of-n -------------------------------------------------------------------------------------

def pass_at(n, k, m):
    """P(one of n lines scans), unbiased from k of m lines: 1 − C(m − k, n)/C(m, n), per prompt."""
    return np.array([1.0 - math.comb(m - int(j), n) / math.comb(m, n) for j in k])


def best_of_n_kl(p, n):
    """KL(π_bon ‖ π) per line for a yes/no judge: the Bernoulli KL of q = 1 − (1 − p)^n against p."""
    p = np.asarray(p, dtype=np.float64)
    return bernoulli_kl(1 - (1 - p) ** n, p)


def plug_in_bias(k, m, n):
    """E f(k'/m) − f(k/m), k' ~ Bin(m, k/m), f = ``best_of_n_kl``: the plug-in's bias at p = p̂."""
    j = np.arange(m + 1)
    f = best_of_n_kl(j / m, n)                                                # (m + 1,)
    comb = np.array([math.comb(m, i) for i in j], dtype=np.float64)
    out = []
    for p in np.asarray(k) / m:
        pmf = comb * p ** j * (1 - p) ** (m - j)
        out.append(float(pmf @ f - best_of_n_kl(p, n)))
    return np.array(out)


def best_of(ref, tokenizer, eval_ids, samples):
    """Best-of-n's rate and KL per line under each judge, from ``samples`` base lines per prompt."""
    resp, lens, lenient = PF.draw(ref, tokenizer, eval_ids, samples, seed=2)
    strict = judged_by(strict_judge(), tokenizer, resp, lens)
    k = {"lenient": lenient.sum(1), "strict": strict.sum(1)}
    both = (lenient & strict).sum(1)
    out = {"samples_per_prompt": samples,
           "per_prompt": {"scans": k["lenient"].tolist(), "scans_strict": k["strict"].tolist(),
                          "scans_both": both.tolist()}, "by": {}}
    for judge, kj in k.items():
        rows = {}
        for n in PF.BEST_OF:
            if n > samples:
                continue
            kl = best_of_n_kl(kj / samples, n)
            rows[str(n)] = {"rate": float(pass_at(n, kj, samples).mean()),
                            "kl_per_line": float(kl.mean()),
                            "kl_bias": float(plug_in_bias(kj, samples, n).mean())}
        out["by"][judge] = rows
    out["strict_of_lenient_choice"] = {
        str(n): float(strict_of_lenient(k["lenient"], k["strict"], both, samples, n).mean())
        for n in PF.BEST_OF if n <= samples}
    return out


def strict_of_lenient(k_l, k_s, k_both, m, n):
    """Per prompt: the chance that best-of-n picked by the lenient judge returns a line the strict
    judge passes: q_L P(S | L) + (1 − q_L) P(S | not L), each estimated from the m lines."""
    k_l, k_s, k_both = (np.asarray(a, dtype=np.float64) for a in (k_l, k_s, k_both))
    q = pass_at(n, k_l, m)
    s_given_l = np.divide(k_both, k_l, out=np.zeros_like(k_l), where=k_l > 0)
    s_given_not = np.divide(k_s - k_both, m - k_l, out=np.zeros_like(k_l), where=k_l < m)
    return q * s_given_l + (1 - q) * s_given_not
