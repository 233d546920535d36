"""The Reality Check's published hyperparameters, translated from PML 0.9.x to PML 2.9, by the maths.

Musgrave, Belongie & Lim, "A Metric Learning Reality Check", ECCV 2020 ("RC") tuned 14 methods and
published the optimum per dataset in powerful-benchmarker, branch ``metric-learning``,
``docs/papers/mlrc.md``, section "Optimal hyperparameters" (batch-32 study). RC ran on
pytorch-metric-learning (PML) 0.9.x: its saved configs hold ``avg_non_zero_only`` (Contrastive, Triplet,
SNR), which PML dropped on 2020-06-04 (2aefbe8, 0.9.87.dev4; released in 0.9.87, 2020-06-20), and
it ran NTXentLoss, added in PML 0.9.73 (9859b80, 2020-02-18). Over that range (0.9.73 .. 0.9.87.dev3)
the code of every loss RC ran computes the same maths for RC's configuration (c661a47 = 0.9.76,
2020-02-29, is cited below; 0.9.86 differs only in MarginLoss's ``nu`` term, 0 here, and in
1e-16 guards), except that before 0.9.76 TripletMarginLoss and MarginLoss sampled 100 random
triplets per anchor by default instead of taking all of them.

This module holds
  (a) ``RC_PUBLISHED``: the table of mlrc.md as printed, and independent float64 references of the
      PML 0.9.x loss for RC's configuration (``rc_*``: written from the maths of that code: embeddings
      L2-normalised inside the loss, no miner except for "Multi Similarity + Miner");
  (b) ``translated_kwargs(method, dataset)``: the dmlbench / PML 2.9 parameters that compute the same
      loss. Where the conventions differ:
        * SoftTriple: 0.9.x's built-in ``reg_weight`` term is sum sqrt(2 + 1e-5 - 2 s) / #pairs;
          2.9's ``SparseCentersRegularizer`` divides by 2 #pairs (PML 96256b4, 2020-06-12, "multiplied
          the denominator in its reg loss by 2"), so ``tau`` (``weight_reg_weight``) = 2 x reg_weight.
          SOP's "N/A" = no regulariser: tau 0 (RC's sop_soft_triple.html searched no reg_weight; the
          (C K)^2 centre-similarity matrix of SOP's ~8.5k training classes per fold is too large,
          and PML 75fde73, 2020-01-31, skipped it "if there are a lot of classes and reg_weight is 0").
          ``gamma`` is NOT inverted: both versions compute ``self.gamma = 1./gamma`` and
          softmax(s * self.gamma) (0.9.x's docs called it "the similarity-to-centers multiplier",
          the code divided by it), so RC's gamma passes unchanged.
        * Triplet, Margin, Margin/class: no miner (RC used every triplet of the batch); dmlbench
          attaches a default miner to ``triplet`` and ``margin``: ``miner: false``.
        * Multi Similarity (no miner): the registry entry ``multi_similarity_without_miner``.
        * SNR: ``regularizer_weight`` -> ``zero_mean_reg_weight`` (2.9's ZeroMeanRegularizer, mean over
          the batch of |sum_k x_k|, the same as 0.9.x's built-in term) - equal because dmlbench's model
          outputs unit-norm embeddings: 2.9 applies the regulariser to the embeddings it is given,
          0.9.x to the embeddings after its own L2 normalisation.
        * Contrastive: RC's CUB ``pos_margin`` -0.2 passes unchanged: relu(d + 0.2) = d + 0.2, every
          positive pair is "non-zero" in both versions. 0 (the FAQ's "equivalent") gives the same
          gradients but a loss lower by exactly 0.2.
        * "lr" of the loss's own parameters -> ``param_lr`` (absolute; powerful-benchmarker's
          ``optimizers/metric_loss_optimizer/RMSprop/lr``, the key in RC's Ax plots). Margin's plots
          are named ``*_margin_no_weight_decay.html``: ``param_weight_decay: 0`` for beta.
        Everything else passes unchanged (ArcFace's margin is in degrees in both versions).
  (c) tests: the PML 2.9 loss built through dmlbench's registry with the translated parameters gives
      RC's loss value and gradients (w.r.t. the raw embeddings, through dmlbench's L2 normalisation,
      and w.r.t. the loss's own parameters) to 1e-10 relative in float64; the naive passes do not;
  (d) one test that params.yaml's ``reality_check`` protocol carries exactly the translation.

The references leave out three numerical guards of PML 0.9.x that are no hyperparameters and that
2.9 does not have (``PML09_GUARDS``; their size is checked in ``test_pml09_numerical_guards_*``), and
three behaviours of 0.9.x that no 2.9 argument reproduces are pinned down as such
(``test_behaviour_*``): the MS miner's self-pairs, NTXent's 1e-20 floor, ArcFace beyond pi - m.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import yaml
from helpers.project import ROOT

from dmlbench.grid import Combo
from dmlbench.losses import LOSSES
from dmlbench.params.load import parse_params


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny float64 tensors: one intra-op thread is several times faster here (no thread start-up
    per op) and gives the same bits on any core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


DTYPE = torch.float64
DATASETS = ("cub200", "cars196", "sop")

# --------------------------------------------------------------------------- (a) RC's published table

# powerful-benchmarker @ metric-learning, docs/papers/mlrc.md, "Optimal hyperparameters", columns
# CUB200 / Cars196 / SOP (the "CUB200 with Batch 256" column is another study). Values as printed;
# keys = the row's parameter names ("proxy lr" -> proxy_lr, "init beta" -> init_beta, ...).
# Methods are keyed by the dmlbench registry entry that runs them; mlrc.md's row label is the comment.
RC_PUBLISHED: dict[str, dict[str, dict[str, float | int | None]]] = {
    "contrastive": {  # Contrastive
        "cub200": {"pos_margin": -0.2000, "neg_margin": 0.3841},
        "cars196": {"pos_margin": 0.2652, "neg_margin": 0.5409},
        "sop": {"pos_margin": 0.2850, "neg_margin": 0.5130},
    },
    "triplet": {  # Triplet
        "cub200": {"margin": 0.0961},
        "cars196": {"margin": 0.1190},
        "sop": {"margin": 0.0451},
    },
    "ntxent": {  # NTXent
        "cub200": {"temperature": 0.0091},
        "cars196": {"temperature": 0.0219},
        "sop": {"temperature": 0.0002},
    },
    "proxy_nca": {  # ProxyNCA
        "cub200": {"proxy_lr": 6.04e-3, "softmax_scale": 13.98},
        "cars196": {"proxy_lr": 4.43e-3, "softmax_scale": 7.97},
        "sop": {"proxy_lr": 5.28e-4, "softmax_scale": 10.73},
    },
    "margin": {  # Margin
        "cub200": {"beta_lr": 1.31e-3, "margin": 0.0878, "init_beta": 0.7838},
        "cars196": {"beta_lr": 1.11e-4, "margin": 0.0781, "init_beta": 1.3164},
        "sop": {"beta_lr": 1.82e-3, "margin": 0.0915, "init_beta": 1.1072},
    },
    "margin_per_class": {  # Margin / class
        "cub200": {"beta_lr": 2.65e-4, "margin": 0.0779, "init_beta": 0.9796},
        "cars196": {"beta_lr": 4.76e-05, "margin": 0.0776, "init_beta": 0.9598},
        "sop": {"beta_lr": 7.10e-05, "margin": 0.0518, "init_beta": 0.8424},
    },
    "normalized_softmax": {  # Normalized Softmax
        "cub200": {"weights_lr": 4.46e-3, "temperature": 0.1087},
        "cars196": {"weights_lr": 1.10e-2, "temperature": 0.0886},
        "sop": {"weights_lr": 5.46e-4, "temperature": 0.0630},
    },
    "cosface": {  # CosFace
        "cub200": {"weights_lr": 2.53e-3, "margin": 0.6182, "scale": 100.0},
        "cars196": {"weights_lr": 7.41e-3, "margin": 0.4324, "scale": 161.5},
        "sop": {"weights_lr": 2.16e-3, "margin": 0.3364, "scale": 100.0},
    },
    "arcface": {  # ArcFace (margin in degrees)
        "cub200": {"weights_lr": 5.13e-3, "margin": 23.22, "scale": 100.0},
        "cars196": {"weights_lr": 7.39e-06, "margin": 20.52, "scale": 49.50},
        "sop": {"weights_lr": 2.01e-3, "margin": 18.63, "scale": 220.3},
    },
    "fastap": {  # FastAP
        "cub200": {"num_bins": 17},
        "cars196": {"num_bins": 27},
        "sop": {"num_bins": 16},
    },
    "snr": {  # SNR Contrastive
        "cub200": {"pos_margin": 0.3264, "neg_margin": 0.8446, "regularizer_weight": 0.1382},
        "cars196": {"pos_margin": 0.1670, "neg_margin": 0.9337, "regularizer_weight": 0},
        "sop": {"pos_margin": 0.3759, "neg_margin": 1.0831, "regularizer_weight": 0},
    },
    "multi_similarity_without_miner": {  # Multi Similarity
        "cub200": {"alpha": 0.01, "beta": 50.60, "base": 0.56},
        "cars196": {"alpha": 14.35, "beta": 75.83, "base": 0.66},
        "sop": {"alpha": 8.49, "beta": 57.38, "base": 0.41},
    },
    "multi_similarity": {  # Multi Similarity + Miner
        "cub200": {"alpha": 17.97, "beta": 75.66, "base": 0.77, "epsilon": 0.39},
        "cars196": {"alpha": 7.49, "beta": 47.99, "base": 0.63, "epsilon": 0.72},
        "sop": {"alpha": 15.94, "beta": 156.61, "base": 0.72, "epsilon": 0.34},
    },
    "soft_triple": {  # SoftTriple (SOP reg_weight "N/A")
        "cub200": {"weights_lr": 5.37e-05, "la": 78.02, "gamma": 58.95, "reg_weight": 0.3754, "margin": 0.4307},
        "cars196": {"weights_lr": 1.40e-4, "la": 17.69, "gamma": 19.18, "reg_weight": 0.0669, "margin": 0.3588},
        "sop": {"weights_lr": 8.68e-05, "la": 100.00, "gamma": 47.90, "reg_weight": None, "margin": 0.3145},
    },
}
METHODS = tuple(RC_PUBLISHED)
CELLS = [(m, d) for m in METHODS for d in DATASETS]

# The numerical guards of PML 0.9.x (c661a47) that PML 2.9 does not have; not hyperparameters.
PML09_GUARDS = {
    # TripletMarginLoss / MarginLoss: F.pairwise_distance(x1, x2, p=2) (eps=1e-6: ||x1 - x2 + 1e-6||)
    "pairwise_distance_eps": 1e-6,
    # SoftTripleLoss reg: sqrt(2.0 + 1e-5 - 2 s); 2.9 SparseCentersRegularizer: sqrt(2 + tiny - 2 s)
    "soft_triple_sqrt_eps": 1e-5,
    # NTXentLoss: log(num / den + 1e-20); 2.9: + torch.finfo(dtype).tiny
    "ntxent_floor": 1e-20,
}
NO_GUARDS = {key: 0.0 for key in PML09_GUARDS}


# --------------------------------------------------------------------------- (a) references: PML 0.9.x


def _unit(z: torch.Tensor) -> torch.Tensor:
    """0.9.x BaseMetricLossFunction(normalize_embeddings=True) and BaseMiner normalise first."""
    return F.normalize(z, p=2, dim=1)


def _pair_masks(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All ordered positive pairs (a != p) and all negative pairs of the batch."""
    same = labels[:, None] == labels[None, :]
    return same & ~torch.eye(len(labels), dtype=torch.bool), ~same


def _triplets(labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Every (anchor, positive, negative) of the batch (0.9.x ``triplets_per_anchor="all"``)."""
    pos, neg = _pair_masks(labels)
    return torch.where(pos[:, :, None] & neg[:, None, :])


def _dist(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor, eps: float) -> torch.Tensor:
    """||x_i - x_j + eps|| (F.pairwise_distance's formula; eps = 0 is the Euclidean distance)."""
    return (x[i] - x[j] + eps).pow(2).sum(dim=1).sqrt()


def _avg_non_zero(terms: torch.Tensor) -> torch.Tensor:
    """0.9.x ``avg_non_zero_only=True``: sum / (number of terms > 0 + 1e-16)."""
    return terms.sum() / ((terms > 0).sum() + 1e-16)


def rc_contrastive(z, labels, pos_margin, neg_margin):
    """ContrastiveLoss(pos_margin, neg_margin), use_similarity=False, power=1, avg_non_zero_only=True:
    mean_{non-zero}[d_ap - m_pos]_+ + mean_{non-zero}[m_neg - d_an]_+, d Euclidean."""
    x = _unit(z)
    pos, neg = _pair_masks(labels)
    d_pos, d_neg = _dist(x, *torch.where(pos), 0.0), _dist(x, *torch.where(neg), 0.0)
    return _avg_non_zero(F.relu(d_pos - pos_margin)) + _avg_non_zero(F.relu(neg_margin - d_neg))


def rc_triplet(z, labels, margin, guards=NO_GUARDS):
    """TripletMarginLoss(margin), all triplets, avg_non_zero_only=True: mean_{non-zero}[d_ap - d_an + m]_+."""
    x = _unit(z)
    a, p, n = _triplets(labels)
    eps = guards["pairwise_distance_eps"]
    return _avg_non_zero(F.relu(_dist(x, a, p, eps) - _dist(x, a, n, eps) + margin))


def rc_ntxent(z, labels, temperature, guards=NO_GUARDS):
    """NTXentLoss(temperature): for every positive pair (a, p), with s = cosine / t,
    -log(e^{s_ap} / (e^{s_ap} + sum_{n: y_n != y_a} e^{s_an}) + floor); mean over the pairs."""
    x = _unit(z)
    s = x @ x.T / temperature
    pos, neg = _pair_masks(labels)
    a, p = torch.where(pos)
    s_neg = torch.where(neg[a], s[a], -math.inf)  # one row of negatives per positive pair
    top = torch.maximum(s[a, p], s_neg.max(dim=1).values).detach()
    numerator = torch.exp(s[a, p] - top)
    ratio = numerator / (numerator + torch.exp(s_neg - top[:, None]).sum(dim=1))
    return -torch.log(ratio + guards["ntxent_floor"]).mean()


def rc_proxy_nca(z, labels, proxies, softmax_scale):
    """ProxyNCALoss(softmax_scale): -log softmax_c(-s ||x - p_c||^2)[y], x and proxies normalised,
    the softmax over every proxy (the own class's included); mean over the batch."""
    x, prox = _unit(z), _unit(proxies)
    sq_dist = (x[:, None, :] - prox[None, :, :]).pow(2).sum(dim=2)
    return -F.log_softmax(-softmax_scale * sq_dist, dim=1)[torch.arange(len(labels)), labels].mean()


def rc_margin(z, labels, beta, margin, guards=NO_GUARDS):
    """MarginLoss(margin, nu=0, beta) with learnable beta (one, or one per class: beta[y_anchor]), all
    triplets: (sum [d_ap - beta + m]_+ + sum [beta - d_an + m]_+) / (#non-zero terms of both)."""
    x = _unit(z)
    a, p, n = _triplets(labels)
    b = beta if beta.numel() == 1 else beta[labels[a]]
    eps = guards["pairwise_distance_eps"]
    pos = F.relu(_dist(x, p, a, eps) - b + margin)
    neg = F.relu(b - _dist(x, n, a, eps) + margin)
    return (pos.sum() + neg.sum()) / ((pos > 0).sum() + (neg > 0).sum() + 1e-16)


def rc_normalized_softmax(z, labels, weights, temperature):
    """NormalizedSoftmaxLoss(temperature): cross-entropy of x . w_c / t, columns w_c normalised."""
    return F.cross_entropy(_unit(z) @ F.normalize(weights, dim=0) / temperature, labels)


def _cosines(z, weights):
    return _unit(z) @ F.normalize(weights, dim=0)


def rc_cosface(z, labels, weights, margin, scale):
    """CosFaceLoss(margin, scale): cross-entropy of scale (cos theta_c - margin [c = y])."""
    cos = _cosines(z, weights)
    onehot = F.one_hot(labels, cos.shape[1]).to(cos.dtype)
    return F.cross_entropy(scale * (cos - margin * onehot), labels)


def rc_arcface(z, labels, weights, margin, scale):
    """ArcFaceLoss(margin [degrees], scale): cross-entropy of scale cos(theta_c + m [c = y]),
    theta_y = acos(clamp(cos, -1 + 1e-7, 1 - 1e-7))."""
    cos = _cosines(z, weights)
    cos_y = cos[torch.arange(len(labels)), labels]
    theta_y = torch.acos(torch.clamp(cos_y, -1 + 1e-7, 1 - 1e-7))
    with_margin = torch.cos(theta_y + math.radians(margin))
    onehot = F.one_hot(labels, cos.shape[1]).to(cos.dtype)
    return F.cross_entropy(scale * (cos + onehot * (with_margin - cos_y)[:, None]), labels)


def rc_fastap(z, labels, num_bins):
    """FastAPLoss(num_bins): squared distances of unit vectors binned by triangular kernels centred
    on num_bins + 1 points over [0, 4]; AP_i = sum_k h+_ik H+_ik / H_ik / N+_i; loss 1 - mean_i AP_i."""
    x = _unit(z)
    pos, neg = _pair_masks(labels)
    sq_dist = (x[:, None, :] - x[None, :, :]).pow(2).sum(dim=2)
    delta = 4.0 / num_bins
    centres = torch.linspace(0.0, 4.0, num_bins + 1, dtype=z.dtype)
    pulse = F.relu(1 - (sq_dist[None] - centres[:, None, None]).abs() / delta)  # bins x N x N
    h_pos = (pulse * pos).sum(dim=2).T  # N x bins
    h_all = h_pos + (pulse * neg).sum(dim=2).T
    cum_pos, cum_all = h_pos.cumsum(dim=1), h_all.cumsum(dim=1)
    product = h_pos * cum_pos
    safe = (product > 0) & (cum_all > 0)
    ap_terms = torch.where(safe, product / torch.where(safe, cum_all, torch.ones_like(cum_all)), 0.0)
    n_pos = pos.sum(dim=1)
    ap = ap_terms.sum(dim=1)[n_pos > 0] / n_pos[n_pos > 0]
    return 1 - ap.mean()


def rc_snr(z, labels, pos_margin, neg_margin, regularizer_weight):
    """SignalToNoiseRatioContrastiveLoss: d(a, o) = Var(x_a - x_o) / Var(x_a);
    mean_{non-zero}[d_ap - m_pos]_+ + mean_{non-zero}[m_neg - d_an]_+ + w mean_i |sum_k x_ik|."""
    x = _unit(z)
    pos, neg = _pair_masks(labels)

    def snr(i, j):
        return torch.var(x[i] - x[j], dim=1) / torch.var(x[i], dim=1)

    loss = _avg_non_zero(F.relu(snr(*torch.where(pos)) - pos_margin))
    loss = loss + _avg_non_zero(F.relu(neg_margin - snr(*torch.where(neg))))
    if regularizer_weight > 0:
        loss = loss + regularizer_weight * x.sum(dim=1).abs().mean()
    return loss


def _masked_softplus_sum(values, mask):
    """log(1 + sum_{mask} e^values) per row (0 for a row with an empty mask)."""
    masked = torch.where(mask, values, -math.inf)
    zeros = torch.zeros(len(values), 1, dtype=values.dtype)
    return torch.logsumexp(torch.cat([masked, zeros], dim=1), dim=1)


def rc_multi_similarity(z, labels, alpha, beta, base, pos_mask=None, neg_mask=None):
    """MultiSimilarityLoss(alpha, beta, base) over the given pairs (default: every pair), S cosine:
    mean over ALL anchors i of 1/alpha log(1 + sum_p e^{-alpha (S_ip - base)})
    + 1/beta log(1 + sum_n e^{beta (S_in - base)})."""
    x = _unit(z)
    sim = x @ x.T
    all_pos, all_neg = _pair_masks(labels)
    pos_mask = all_pos if pos_mask is None else pos_mask
    neg_mask = all_neg if neg_mask is None else neg_mask
    pos_loss = _masked_softplus_sum(-alpha * (sim - base), pos_mask) / alpha
    neg_loss = _masked_softplus_sum(beta * (sim - base), neg_mask) / beta
    return (pos_loss + neg_loss).mean()


def rc_ms_miner(z, labels, epsilon, self_pairs=True):
    """MultiSimilarityMiner(epsilon), PML 0.9.x: positives with S_ip - eps < max_n S_in, negatives
    with S_in + eps > min_p S_ip. In 0.9.x the anchor itself (S_ii = 1) stays among the candidate
    positives (only the negatives' diagonal is masked): ``self_pairs=True`` is 0.9.x; PML 0.9.87
    (bd11f39, 2020-06-15) removed the self-pairs, as 2.9 does."""
    with torch.no_grad():
        x = _unit(z)
        sim = x @ x.T
        pos, neg = _pair_masks(labels)
        candidates = pos | torch.eye(len(labels), dtype=torch.bool) if self_pairs else pos
        hardest_neg = sim.masked_fill(~neg, -math.inf).max(dim=1, keepdim=True).values
        easiest_pos = sim.masked_fill(~candidates, math.inf).min(dim=1, keepdim=True).values
        return candidates & (sim - epsilon < hardest_neg), neg & (sim + epsilon > easiest_pos)


def rc_soft_triple(z, labels, centres, la, gamma, margin, reg_weight, centers_per_class, guards=NO_GUARDS):
    """SoftTripleLoss(la, gamma, reg_weight, margin), PML 0.9.x (before 96256b4): S_ck = x . c_ck
    (centres normalised), S_c = sum_k softmax_k(S_ck / gamma) S_ck (0.9.x: ``self.gamma = 1./gamma``),
    loss = CE(la (S - margin [c = y])) + reg_weight sum_{same class, k < k'} sqrt(2 - 2 c_k . c_k')
    / #such pairs."""
    x, unit_centres = _unit(z), F.normalize(centres, dim=0)
    num_classes = centres.shape[1] // centers_per_class
    sim = (x @ unit_centres).view(len(x), num_classes, centers_per_class)
    sim_to_classes = (F.softmax(sim / gamma, dim=2) * sim).sum(dim=2)
    logits = la * (sim_to_classes - margin * F.one_hot(labels, num_classes).to(x.dtype))
    loss = F.cross_entropy(logits, labels)
    if reg_weight and reg_weight > 0 and centers_per_class > 1:
        block = torch.triu(torch.ones(centers_per_class, centers_per_class, dtype=torch.bool), diagonal=1)
        same_class_pairs = torch.block_diag(*[block] * num_classes)
        centre_sims = unit_centres.T @ unit_centres
        distances = torch.sqrt(2.0 + guards["soft_triple_sqrt_eps"] - 2.0 * centre_sims[same_class_pairs])
        loss = loss + reg_weight * distances.sum() / same_class_pairs.sum()
    return loss


# --------------------------------------------------------------------------- (b) the translation


def translated_kwargs(method: str, dataset: str) -> dict:
    """dmlbench's parameters (registry entry ``method``) computing RC's loss on ``dataset``."""
    rc = RC_PUBLISHED[method][dataset]
    if method == "contrastive":  # negative pos_margin kept: relu(d + 0.2) = d + 0.2 in both versions
        return {"pos_margin": rc["pos_margin"], "neg_margin": rc["neg_margin"]}
    if method == "triplet":
        return {"margin": rc["margin"], "miner": False}
    if method == "ntxent":
        return {"temperature": rc["temperature"]}
    if method == "proxy_nca":
        return {"param_lr": rc["proxy_lr"], "softmax_scale": rc["softmax_scale"]}
    if method in ("margin", "margin_per_class"):  # nu = 0 (module default): RC did not search it
        return {
            "param_lr": rc["beta_lr"],
            "margin": rc["margin"],
            "beta": rc["init_beta"],
            "miner": False,
            "param_weight_decay": 0.0,  # RC's plots: *_margin[_param_per_class]_no_weight_decay.html
        }
    if method == "normalized_softmax":
        return {"param_lr": rc["weights_lr"], "temperature": rc["temperature"]}
    if method in ("cosface", "arcface"):  # ArcFace margin: degrees in both versions
        return {"param_lr": rc["weights_lr"], "margin": rc["margin"], "scale": rc["scale"]}
    if method == "fastap":
        return {"num_bins": rc["num_bins"]}
    if method == "snr":
        return {
            "pos_margin": rc["pos_margin"],
            "neg_margin": rc["neg_margin"],
            "zero_mean_reg_weight": float(rc["regularizer_weight"]),
        }
    if method == "multi_similarity_without_miner":
        return {"alpha": rc["alpha"], "beta": rc["beta"], "base": rc["base"]}
    if method == "multi_similarity":
        return {"alpha": rc["alpha"], "beta": rc["beta"], "base": rc["base"], "miner_epsilon": rc["epsilon"]}
    if method == "soft_triple":  # 0.9.x reg / #pairs = 2.9 SparseCentersRegularizer x 2; "N/A" = none
        return {
            "param_lr": rc["weights_lr"],
            "la": rc["la"],
            "gamma": rc["gamma"],  # not inverted: both versions divide by it
            "margin": rc["margin"],
            "tau": 2.0 * (rc["reg_weight"] or 0.0),
        }
    raise KeyError(method)


# --------------------------------------------------------------------------- test data and running

EMBEDDING_DIM = 16
BATCH_LABELS = torch.arange(8).repeat_interleave(4)  # RC's batches: 8 classes x 4 images
NUM_CLASSES = 5  # classification losses: a small class count, 2 images per class
CLASS_LABELS = torch.arange(NUM_CLASSES).repeat(2)
PARAMETER = {  # the loss's own parameter in PML 2.9 (same name and shape as in 0.9.x)
    "proxy_nca": "proxies",
    "margin": "beta",
    "margin_per_class": "beta",
    "normalized_softmax": "W",
    "cosface": "W",
    "arcface": "W",
    "soft_triple": "fc",
}
# Embeddings per method: (closeness of the classes, per-sample noise range) of _embeddings, chosen
# so that every hinge of each loss has active and inactive terms on RC's values of all three datasets
# (asserted in the tests); "separated" for the MS miner (see _separated).
DATA = {
    "contrastive": (3.0, (0.1, 1.0)),
    "margin": (1.5, (0.2, 2.0)),
    "margin_per_class": (1.5, (0.2, 2.0)),
    "multi_similarity": "separated",
}
DEFAULT_DATA = (1.5, (0.1, 1.0))


def _generator(*key) -> torch.Generator:
    return torch.Generator().manual_seed(sum(ord(c) * (i + 1) for i, c in enumerate("/".join(map(str, key)))))


def _randn(gen, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=DTYPE)


def _rand(gen, *shape) -> torch.Tensor:
    return torch.rand(*shape, generator=gen, dtype=DTYPE)


def _embeddings(labels, closeness, gen, spread=(0.1, 1.0)) -> torch.Tensor:
    """Raw (unnormalised) embeddings: class centres around a shared direction (the larger
    ``closeness``, the closer the classes), per-sample noise, random norms; a float64 leaf."""
    n, n_classes, root_dim = len(labels), int(labels.max()) + 1, EMBEDDING_DIM**0.5
    common = F.normalize(_randn(gen, EMBEDDING_DIM), dim=0)
    centres = F.normalize(closeness * common + _randn(gen, n_classes, EMBEDDING_DIM) / root_dim, dim=1)
    noise = spread[0] + (spread[1] - spread[0]) * _rand(gen, n, 1)
    z = centres[labels] + noise * _randn(gen, n, EMBEDDING_DIM) / root_dim
    return (z * (0.5 + 1.5 * _rand(gen, n, 1))).requires_grad_()


def _separated(labels, gen) -> torch.Tensor:
    """Each class in its own plane (dims 2c, 2c + 1) at a random angle in [-1, 1] rad, plus a little
    noise: negatives nearly orthogonal (below 1 - epsilon for RC's epsilons, so PML 0.9.x's MS-miner
    self-pairs stay off: test_behaviour_ms_miner_self_pairs), positives' similarities spread."""
    n = len(labels)
    angle = 2 * _rand(gen, n) - 1
    z = torch.zeros(n, EMBEDDING_DIM, dtype=DTYPE)
    z[torch.arange(n), 2 * labels] = torch.cos(angle)
    z[torch.arange(n), 2 * labels + 1] = torch.sin(angle)
    z = z + 0.03 * _randn(gen, n, EMBEDDING_DIM)
    return (z * (0.5 + 1.5 * _rand(gen, n, 1))).requires_grad_()


def _near_collapsed(labels, temperature, gen) -> torch.Tensor:
    """Embeddings whose cosine similarities all lie within ~10 temperatures of each other, so that
    NTXent's probabilities stay away from 0 (its saturated regime: test_behaviour_ntxent_floor)."""
    direction = F.normalize(_randn(gen, EMBEDDING_DIM), dim=0)
    width = (10 * temperature / EMBEDDING_DIM) ** 0.5
    class_offsets = width * _randn(gen, int(labels.max()) + 1, EMBEDDING_DIM)
    z = direction + class_offsets[labels] + 0.5 * width * _randn(gen, len(labels), EMBEDDING_DIM)
    return z.requires_grad_()


def _data(method: str, dataset: str):
    """(raw embeddings, labels, the loss's own parameter or None, num_classes) for one cell."""
    gen = _generator(method, dataset)
    if method not in PARAMETER or method.startswith("margin"):
        labels = BATCH_LABELS
        setting = DATA.get(method, DEFAULT_DATA)
        if method == "ntxent":
            z = _near_collapsed(labels, RC_PUBLISHED[method][dataset]["temperature"], gen)
        elif setting == "separated":
            z = _separated(labels, gen)
        else:
            z = _embeddings(labels, setting[0], gen, spread=setting[1])
        num_classes = int(labels.max()) + 1
    else:
        labels, num_classes = CLASS_LABELS, NUM_CLASSES
        z = _embeddings(labels, 0.0, gen, spread=(1.0, 3.0))
    param = None
    if method == "proxy_nca":
        param = _randn(gen, num_classes, EMBEDDING_DIM)
    elif method == "margin":
        param = torch.tensor([RC_PUBLISHED[method][dataset]["init_beta"]], dtype=DTYPE)
    elif method == "margin_per_class":  # as if trained a while: the classes' betas differ
        param = RC_PUBLISHED[method][dataset]["init_beta"] + 0.1 * _randn(gen, num_classes)
    elif method in ("normalized_softmax", "cosface", "arcface"):
        param = _randn(gen, EMBEDDING_DIM, num_classes)
    elif method == "soft_triple":
        k = LOSSES["soft_triple"].params().centers_per_class
        param = _randn(gen, EMBEDDING_DIM, num_classes * k)
    return z, labels, (None if param is None else param.requires_grad_()), num_classes


def reference(method: str, dataset: str, z, labels, param, guards=NO_GUARDS) -> torch.Tensor:
    """RC's loss (PML 0.9.x, RC's published values) on raw embeddings ``z``."""
    rc = RC_PUBLISHED[method][dataset]
    if method == "contrastive":
        return rc_contrastive(z, labels, rc["pos_margin"], rc["neg_margin"])
    if method == "triplet":
        return rc_triplet(z, labels, rc["margin"], guards)
    if method == "ntxent":
        return rc_ntxent(z, labels, rc["temperature"], guards)
    if method == "proxy_nca":
        return rc_proxy_nca(z, labels, param, rc["softmax_scale"])
    if method in ("margin", "margin_per_class"):
        return rc_margin(z, labels, param, rc["margin"], guards)
    if method == "normalized_softmax":
        return rc_normalized_softmax(z, labels, param, rc["temperature"])
    if method == "cosface":
        return rc_cosface(z, labels, param, rc["margin"], rc["scale"])
    if method == "arcface":
        return rc_arcface(z, labels, param, rc["margin"], rc["scale"])
    if method == "fastap":
        return rc_fastap(z, labels, rc["num_bins"])
    if method == "snr":
        return rc_snr(z, labels, rc["pos_margin"], rc["neg_margin"], rc["regularizer_weight"])
    if method == "multi_similarity_without_miner":
        return rc_multi_similarity(z, labels, rc["alpha"], rc["beta"], rc["base"])
    if method == "multi_similarity":
        pos_mask, neg_mask = rc_ms_miner(z, labels, rc["epsilon"])
        return rc_multi_similarity(z, labels, rc["alpha"], rc["beta"], rc["base"], pos_mask, neg_mask)
    if method == "soft_triple":
        k = LOSSES["soft_triple"].params().centers_per_class
        return rc_soft_triple(z, labels, param, rc["la"], rc["gamma"], rc["margin"], rc["reg_weight"], k, guards)
    raise KeyError(method)


def dmlbench_loss(name: str, kwargs: dict, z, labels, param, num_classes, normalise: bool = True):
    """Build the loss (and its miner) through dmlbench's registry, copy ``param`` into the loss's own
    parameter, and compute it on ``F.normalize(z)`` (dmlbench's model outputs unit vectors).
    Returns (loss, the module's parameter or None)."""
    spec = LOSSES[name]
    params = spec.params.model_validate(kwargs)
    module = spec.build(params, num_classes, EMBEDDING_DIM).to(DTYPE)
    own = None
    if param is not None:
        own = getattr(module, PARAMETER[name])
        with torch.no_grad():
            own.copy_(param)
    embeddings = F.normalize(z, p=2, dim=1) if normalise else z
    miner = spec.miner(params)
    indices = miner(embeddings, labels) if miner is not None else None
    return module(embeddings, labels, indices), own


def _assert_close(actual, expected, what, rtol=1e-10):
    """Relative tolerance, with an absolute floor of rtol x the largest entry (for near-zero entries)."""
    atol = rtol * float(expected.abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def _compare(method, dataset, kwargs=None, name=None, guards=NO_GUARDS, normalise=True):
    """RC's and dmlbench's (loss, [gradient w.r.t. the raw embeddings, w.r.t. the own parameter])."""
    z, labels, param, num_classes = _data(method, dataset)
    ref_param = None if param is None else param.detach().clone().requires_grad_()
    ref_value = reference(method, dataset, z, labels, ref_param, guards)
    ref_value.backward()
    ref_grads = [z.grad.clone()] + ([ref_param.grad.clone()] if ref_param is not None else [])
    z.grad = None
    kwargs = translated_kwargs(method, dataset) if kwargs is None else kwargs
    value, own = dmlbench_loss(name or method, kwargs, z, labels, param, num_classes, normalise)
    value.backward()
    grads = [z.grad.clone()] + ([own.grad.clone()] if own is not None else [])
    return (ref_value.detach(), ref_grads), (value.detach(), grads)


# --------------------------------------------------------------------------- (c) the tests


def _assert_meaningful(method: str, dataset: str) -> None:
    """The random batch exercises the loss: its hinges have active and inactive terms, the miner
    selects a strict non-empty subset, angles stay where 0.9.x and 2.9 agree (see the notes)."""
    z, labels, param, _ = _data(method, dataset)
    rc = RC_PUBLISHED[method][dataset]
    x = F.normalize(z.detach(), dim=1)
    pos, neg = _pair_masks(labels)
    d = torch.cdist(x, x)
    a, p, n = _triplets(labels)

    def mixed(terms, what):
        active = float((terms > 0).double().mean())
        assert 0.0 < active < 1.0, f"{method}/{dataset}: {what} hinge active on {active:.0%} of its terms"

    if method == "contrastive":
        if rc["pos_margin"] > 0:
            mixed(d[pos] - rc["pos_margin"], "positive")
        mixed(rc["neg_margin"] - d[neg], "negative")
    elif method == "triplet":
        mixed(d[a, p] - d[a, n] + rc["margin"], "triplet")
    elif method.startswith("margin"):
        b = param.detach() if param.numel() == 1 else param.detach()[labels[a]]
        mixed(d[a, p] - b + rc["margin"], "positive")
        mixed(b - d[a, n] + rc["margin"], "negative")
    elif method == "snr":
        var = lambda i, j: torch.var(x[i] - x[j], dim=1) / torch.var(x[i], dim=1)  # noqa: E731
        mixed(var(*torch.where(pos)) - rc["pos_margin"], "positive")
        mixed(rc["neg_margin"] - var(*torch.where(neg)), "negative")
    elif method == "multi_similarity":
        pos_mined, neg_mined = rc_ms_miner(z, labels, rc["epsilon"], self_pairs=False)
        quirk_pos, _ = rc_ms_miner(z, labels, rc["epsilon"], self_pairs=True)
        assert not (quirk_pos & torch.eye(len(labels), dtype=torch.bool)).any(), "0.9.x self-pairs would fire"
        mined = int(pos_mined.sum() + neg_mined.sum())
        assert 0 < mined < int(pos.sum() + neg.sum()), f"{method}/{dataset}: the miner keeps {mined} pairs"
    elif method == "ntxent":
        s = x @ x.T / rc["temperature"]
        assert float(s.max() - s.min()) < 40, "NTXent's probabilities must stay above its 1e-20 floor"
    elif method == "arcface":
        cos_y = (x @ F.normalize(param.detach(), dim=0))[torch.arange(len(labels)), labels]
        theta = torch.acos(cos_y)
        assert bool((theta < math.pi - math.radians(rc["margin"])).all()), "2.9's monotonic branch would fire"
        assert bool((cos_y.abs() < 1 - 1e-7).all())


@pytest.mark.parametrize("method,dataset", CELLS)
def test_translated_pml29_loss_equals_rc_pml09_loss(method, dataset):
    """RC's loss (PML 0.9.x formula, RC's values) == dmlbench's registry loss with the translated
    values: value and gradients w.r.t. the raw embeddings and the loss's own parameter."""
    _assert_meaningful(method, dataset)
    (ref_value, ref_grads), (value, grads) = _compare(method, dataset)
    _assert_close(value, ref_value, f"{method}/{dataset} loss")
    for i, (g, ref_g) in enumerate(zip(grads, ref_grads, strict=True)):
        _assert_close(g, ref_g, f"{method}/{dataset} gradient w.r.t. {['embeddings', 'parameter'][i]}")
    assert float(ref_grads[0].abs().max()) > 0


@pytest.mark.parametrize("method", METHODS)
def test_only_ms_with_miner_mines(method):
    """RC ran every method on the whole batch except "Multi Similarity + Miner"."""
    for dataset in DATASETS:
        params = LOSSES[method].params.model_validate(translated_kwargs(method, dataset))
        miner = LOSSES[method].miner(params)
        if method == "multi_similarity":
            assert miner is not None and miner.epsilon == RC_PUBLISHED[method][dataset]["epsilon"]
        else:
            assert miner is None, f"{method}: {type(miner).__name__}"


def _differs(ref, ours, rtol=1e-6):
    (ref_value, ref_grads), (value, grads) = ref, ours
    close = torch.allclose(value, ref_value, rtol=rtol)
    close &= all(
        torch.allclose(g, r, rtol=rtol, atol=rtol * float(r.abs().max())) for g, r in zip(grads, ref_grads, strict=True)
    )
    return not close


NAIVE = [  # (method, datasets, registry entry, change to the translated kwargs, why it is wrong)
    ("soft_triple", DATASETS[:2], None, lambda m, d: {"tau": RC_PUBLISHED[m][d]["reg_weight"]}, "reg_weight x 1"),
    ("soft_triple", DATASETS, None, lambda m, d: {"gamma": 1 / RC_PUBLISHED[m][d]["gamma"]}, "gamma inverted"),
    ("arcface", DATASETS, None, lambda m, d: {"margin": math.radians(RC_PUBLISHED[m][d]["margin"])}, "radians"),
    ("triplet", DATASETS, None, lambda m, d: {"miner": True}, "semi-hard miner"),
    ("margin", DATASETS, None, lambda m, d: {"miner": True}, "distance-weighted miner"),
    ("multi_similarity_without_miner", DATASETS, "multi_similarity", lambda m, d: {"miner_epsilon": 0.1}, "MS miner"),
    ("contrastive", ("cub200",), None, lambda m, d: {"pos_margin": 0.0}, "pos_margin 0 (loss lower by 0.2)"),
]


@pytest.mark.parametrize("method,datasets,entry,change,why", NAIVE, ids=[f"{n[0]}: {n[4]}" for n in NAIVE])
def test_naive_translation_does_not_match(method, datasets, entry, change, why):
    """Where the conventions differ, RC's value passed as printed (or the registry's default miner)
    computes another loss."""
    for dataset in datasets:
        kwargs = {**translated_kwargs(method, dataset), **change(method, dataset)}
        ref, ours = _compare(method, dataset, kwargs=kwargs, name=entry)
        assert _differs(ref, ours), f"{method}/{dataset}: {why} should not reproduce RC's loss"


def test_contrastive_negative_pos_margin_is_zero_up_to_a_constant():
    """RC's FAQ: a negative positive margin "should be equivalent to a margin of 0". In both versions
    [d + 0.2]_+ = d + 0.2 and every positive pair counts as non-zero, so m_pos = 0 gives exactly
    the same gradients and a loss lower by exactly 0.2 (unless two positives coincide, d = 0)."""
    (ref_value, ref_grads), (value, grads) = _compare(
        "contrastive", "cub200", kwargs={**translated_kwargs("contrastive", "cub200"), "pos_margin": 0.0}
    )
    _assert_close(value + 0.2, ref_value, "loss + 0.2")
    _assert_close(grads[0], ref_grads[0], "gradient")


def test_snr_regulariser_needs_unit_embeddings():
    """2.9's ZeroMeanRegularizer sees the embeddings as given (BaseMetricLossFunction.forward), 0.9.x
    its term after normalising them: equal in dmlbench, whose model outputs unit vectors, not on raw
    embeddings."""
    ref, ours = _compare("snr", "cub200", normalise=False)
    assert _differs(ref, ours)


def test_soft_triple_regulariser_factor_is_exactly_two():
    """0.9.x reg (sum / #pairs) = 2 x 2.9's SparseCentersRegularizer (sum / (2 #pairs)), on the
    regulariser alone: the difference of the dmlbench loss with tau and with tau = 0, over tau."""
    method, dataset = "soft_triple", "cub200"
    base = translated_kwargs(method, dataset)
    (_, _), (with_reg, _) = _compare(method, dataset)
    (_, _), (without_reg, _) = _compare(method, dataset, kwargs={**base, "tau": 0.0})
    z, labels, param, _ = _data(method, dataset)
    k = LOSSES[method].params().centers_per_class
    unit = F.normalize(param.detach(), dim=0)
    block = torch.triu(torch.ones(k, k, dtype=torch.bool), diagonal=1)
    mask = torch.block_diag(*[block] * NUM_CLASSES)
    reg09 = torch.sqrt(2 - 2 * (unit.T @ unit)[mask]).sum() / mask.sum()
    _assert_close((with_reg - without_reg) / base["tau"], reg09 / 2, "2.9 regulariser")


def test_pml09_numerical_guards_are_negligible():
    """With 0.9.x's guards (pairwise_distance's eps 1e-6, SoftTriple's sqrt eps 1e-5, NTXent's 1e-20
    away from saturation) the references move by < 1e-5 relative: no hyperparameter hides there."""
    for method in ("triplet", "margin", "margin_per_class", "soft_triple", "ntxent"):
        for dataset in DATASETS:
            (ref_value, ref_grads), (value, grads) = _compare(method, dataset, guards=PML09_GUARDS)
            _assert_close(value, ref_value, f"{method}/{dataset} loss with 0.9.x guards", rtol=1e-5)
            for g, r in zip(grads, ref_grads, strict=True):
                _assert_close(g, r, f"{method}/{dataset} gradient with 0.9.x guards", rtol=1e-3)


# --------------------------------------------------------------------------- behaviours no argument maps


def test_behaviour_ms_miner_self_pairs():
    """PML 0.9.x's MultiSimilarityMiner keeps the anchor itself as a positive (S_ii = 1) whenever
    1 - epsilon < its hardest negative's similarity: an extra e^{-alpha (1 - base)} inside the
    positive log-sum-exp, which reweights the other positives (no gradient of its own: S_ii = 1).
    Fixed in 0.9.87 (bd11f39, 2020-06-15); 2.9 has no switch for it. RC's Cars196 epsilon 0.72
    (1 - eps = 0.28) makes it common there."""
    method, dataset = "multi_similarity", "cars196"
    rc = RC_PUBLISHED[method][dataset]
    gen = _generator("self-pairs")
    z = _embeddings(BATCH_LABELS, 1.5, gen)
    pos09, neg09 = rc_ms_miner(z, BATCH_LABELS, rc["epsilon"], self_pairs=True)
    assert bool(torch.diagonal(pos09).any()), "the 0.9.x quirk fires on this batch"
    loss09 = rc_multi_similarity(z, BATCH_LABELS, rc["alpha"], rc["beta"], rc["base"], pos09, neg09)
    pos_fixed, neg_fixed = rc_ms_miner(z, BATCH_LABELS, rc["epsilon"], self_pairs=False)
    fixed = rc_multi_similarity(z, BATCH_LABELS, rc["alpha"], rc["beta"], rc["base"], pos_fixed, neg_fixed)
    ours, _ = dmlbench_loss(method, translated_kwargs(method, dataset), z, BATCH_LABELS, None, 8)
    _assert_close(ours.detach(), fixed.detach(), "2.9 = 0.9.x without self-pairs")
    assert not torch.allclose(ours.detach(), loss09.detach(), rtol=1e-6)


def test_behaviour_ntxent_floor():
    """PML 0.9.x: -log(p + 1e-20) caps a positive pair's loss at 46.05 with (almost) no gradient once
    p < ~1e-20, i.e. once a negative beats the positive by > ~46 t in cosine (SOP's t = 0.0002: by
    0.0092). 2.9 adds finfo.tiny instead (float32: the cap is at ~87). Same loss away from it."""
    rc = RC_PUBLISHED["ntxent"]["sop"]
    gen = _generator("ntxent-floor")
    z = _embeddings(BATCH_LABELS, 1.5, gen)
    with_floor = rc_ntxent(z, BATCH_LABELS, rc["temperature"], PML09_GUARDS).item()
    ours, _ = dmlbench_loss("ntxent", translated_kwargs("ntxent", "sop"), z, BATCH_LABELS, None, 8)
    assert with_floor <= -math.log(1e-20) + 1e-9
    assert ours.item() > with_floor + 1.0


def test_behaviour_arcface_beyond_pi_minus_margin():
    """PML >= 1.7.0 (10f202e, 2022-10-30) keeps ArcFace monotonic: for theta_y > pi - m it uses
    cos(theta_y) - m sin(m) where 0.9.x used cos(theta_y + m). Same loss for every theta_y < pi - m."""
    rc = RC_PUBLISHED["arcface"]["cub200"]
    gen = _generator("arcface-antipodal")
    weights = _randn(gen, EMBEDDING_DIM, NUM_CLASSES)
    z = (-weights.T[CLASS_LABELS] + 0.01 * _randn(gen, len(CLASS_LABELS), EMBEDDING_DIM)).requires_grad_()
    ref = rc_arcface(z, CLASS_LABELS, weights, rc["margin"], rc["scale"])
    ours, _ = dmlbench_loss("arcface", translated_kwargs("arcface", "cub200"), z, CLASS_LABELS, weights, NUM_CLASSES)
    assert not torch.allclose(ours.detach(), ref.detach(), rtol=1e-6)


# --------------------------------------------------------------------------- (d) params.yaml


RC_GRID = {"datasets": DATASETS, "backbone": "bn_inception", "dim": 128}


def test_params_yaml_reality_check_protocol_carries_the_translation():
    """params.yaml's ``reality_check`` protocol trains every RC method with ``translated_kwargs``.

    PENDING the lead's wiring of params.yaml (protocols.reality_check.losses / overrides): this test
    fails until every method x dataset resolves to the translation above (it is not skipped)."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw.update(
        protocol="reality_check",
        datasets={name: {"source": {}} for name in RC_GRID["datasets"]},
        backbones={RC_GRID["backbone"]: {}},
        dims=[RC_GRID["dim"]],
        losses={method: {} for method in METHODS},
    )
    raw["tuning"]["baselines"] = []  # the demo's baseline is compared at its own dim
    params = parse_params(raw)
    mismatches = []
    for method in METHODS:
        for dataset in DATASETS:
            got = params.loss_params(Combo(dataset, RC_GRID["backbone"], method, RC_GRID["dim"])).model_dump()
            want = LOSSES[method].params.model_validate(translated_kwargs(method, dataset)).model_dump()
            for key in sorted(set(got) | set(want)):
                g, w = got.get(key), want.get(key)
                same = g == w or (isinstance(g, float) and isinstance(w, float) and math.isclose(g, w, rel_tol=1e-12))
                if not same:
                    mismatches.append(f"{method}/{dataset}.{key}: params.yaml {g!r}, translation {w!r}")
    assert not mismatches, "; ".join(mismatches)
