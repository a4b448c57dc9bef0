"""The PAD pivot classifier: a small head on verifier features (PAD's `extended` variant).

hidden [H] -> Linear(H, 64); scalars [6] -> Linear(6, 16); concat [80] -> Linear(80, 128) -> ReLU ->
Linear(128, 1) = pivot logit. Both inputs are standardised with statistics of the training split,
stored as buffers, so a saved classifier is self-contained.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from relaxspec.pivot.features import SCALAR_FEATURES, candidate_features

FORMAT = "relaxspec-pivot-classifier/1"


class PivotClassifier(nn.Module):
    def __init__(self, hidden_size: int, n_scalars: int = len(SCALAR_FEATURES), hidden_layer: int = -1,
                 spec: dict | None = None, dropout: float = 0.0):
        super().__init__()
        self.hidden_proj = nn.Linear(hidden_size, 64)
        self.scalar_proj = nn.Linear(n_scalars, 16)
        # dropout (training only; no parameters) on the concatenated projections
        self.mlp = nn.Sequential(nn.Dropout(dropout), nn.Linear(80, 128), nn.ReLU(), nn.Linear(128, 1))
        self.register_buffer("hidden_mean", torch.zeros(hidden_size))
        self.register_buffer("hidden_std", torch.ones(hidden_size))
        self.register_buffer("scalar_mean", torch.zeros(n_scalars))
        self.register_buffer("scalar_std", torch.ones(n_scalars))
        self.hidden_layer = hidden_layer
        self.threshold = 0.5  # suggested decode threshold (chosen by train_classifier)
        self.spec = dict(spec or {})
        self.spec.update(hidden_layer=hidden_layer, hidden_size=hidden_size, feature_names=list(SCALAR_FEATURES))
        self.metrics: dict = {}

    def set_normalisation(self, hidden: torch.Tensor, scalars: torch.Tensor) -> None:
        self.hidden_mean.copy_(hidden.mean(0))
        self.hidden_std.copy_(hidden.std(0).clamp_min(1e-6))
        self.scalar_mean.copy_(scalars.mean(0))
        self.scalar_std.copy_(scalars.std(0).clamp_min(1e-6))

    def forward(self, hidden: torch.Tensor, scalars: torch.Tensor) -> torch.Tensor:
        """hidden [..., H], scalars [..., 6] -> pivot logit [...] (`_pivot_logit` on the live parameters: the
        modules hold them, and their names in the state dict)."""
        return _pivot_logit(self._tensors(), hidden.float(), scalars.float(), self.mlp[0].p, self.training)

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        """The classifier's parameters and statistics in the order `_pivot_logit` takes them."""
        first, head = self.mlp[1], self.mlp[3]  # mlp[0] is the Dropout, mlp[2] the ReLU
        return (self.hidden_mean, self.hidden_std, self.hidden_proj.weight, self.hidden_proj.bias,
                self.scalar_mean, self.scalar_std, self.scalar_proj.weight, self.scalar_proj.bias,
                first.weight, first.bias, head.weight, head.bias)

    @torch.no_grad()
    def predict_proba(self, hidden, target_logits, draft_logits, tokens) -> torch.Tensor:
        """P(pivot) from raw model outputs (features by `candidate_features`)."""
        h, s = candidate_features(hidden, target_logits, draft_logits, tokens)
        return torch.sigmoid(self(h.to(self.hidden_mean.device), s.to(self.hidden_mean.device)))

    def check_models(self, verifier, drafter=None) -> list[str]:
        """Ways the given models differ from the ones this classifier was trained with (empty: same), by
        the weight fingerprints it stores: a GGUF model's file hash in any dtype (`models.gguf.gguf_fingerprint`),
        another model's float32 weights (by name for one loaded in another dtype than float32).
        The features depend on the verifier's hidden states and on both distributions."""
        from relaxspec.models.gguf import gguf_fingerprint
        from relaxspec.pivot.label import model_fingerprint

        problems = []
        if verifier.model.config.hidden_size != self.hidden_mean.shape[0]:
            problems.append(f"verifier hidden size {verifier.model.config.hidden_size} != {self.hidden_mean.shape[0]}")
        for role, lm in (("verifier", verifier), ("drafter", drafter)):
            want, trained_with = self.spec.get(f"{role}_fingerprint"), self.spec.get(role)
            if lm is None:
                continue
            from_file = gguf_fingerprint(lm)
            if from_file is not None or str(want or "").startswith("gguf-"):
                if want and from_file != want:
                    problems.append(f"{role} {lm.name!r} is not the {role} {trained_with!r} this classifier "
                                    "was trained with (another GGUF file)")
            elif lm.dtype != torch.float32:
                # Fingerprints hash float32 weights; rounded ones cannot be compared, so the name is checked.
                if trained_with and lm.name != trained_with:
                    problems.append(f"{role} {lm.name!r} is not the {role} {trained_with!r} this classifier "
                                    "was trained with")
            elif want and model_fingerprint(lm) != want:
                problems.append(f"{role} {lm.name!r} has other weights than the {role} "
                                f"{trained_with!r} this classifier was trained with")
        return problems

    def pivot_fn(self, verifier=None, drafter=None, force: bool = False):
        """The callable the engine calls each round: fn(hidden [B,N,H], target_logits [B,N,V],
        draft_logits [B,N,V], draft_tokens [B,N]) -> P(pivot) [B,N] on the logits' device;
        `fn.hidden_layer` tells the engine which verifier layer to hand over. It gives exactly `predict_proba`'s
        values at a fraction of its cost per round: the module's eval forward as functional calls
        (`_pivot_logit`) on the weights copied once per device (`inference_weights`, as they are now), the
        hidden size checked only when a call fails.
        Given the verifier (and drafter), a pair other than the one the classifier was trained with
        (`check_models`) is a ValueError unless `force`."""
        problems = self.check_models(verifier, drafter) if verifier is not None else []
        if problems and not force:
            raise ValueError("the pivot classifier was trained for another pair: " + "; ".join(problems)
                             + " (force=True / --force uses it anyway)")
        self.eval()
        weights = {}  # device -> the classifier's tensors there (`inference_weights`), copied on first use
        size = self.hidden_mean.shape[0]

        def fn(hidden, target_logits, draft_logits, draft_tokens):
            if hidden is None:
                raise ValueError("the pivot classifier needs the verifier's hidden states")
            device = target_logits.device
            w = weights.get(device)
            if w is None:
                w = weights[device] = self.inference_weights(device)
            if hidden.device != device:
                hidden = hidden.to(device)
            try:
                h, s = candidate_features(hidden, target_logits, draft_logits, draft_tokens)
                return torch.sigmoid(_pivot_logit(w, h, s))
            except RuntimeError:  # a hidden size the weights do not take: checked here, not on every call
                if hidden.shape[-1] != size:
                    raise ValueError(f"pivot classifier expects hidden size {size} (verifier "
                                     f"{self.spec.get('verifier')!r}), got {hidden.shape[-1]}") from None
                raise

        fn.hidden_layer = self.hidden_layer
        fn.classifier = self
        return fn

    @torch.no_grad()
    def inference_weights(self, device: torch.device | str | None = None) -> tuple[torch.Tensor, ...]:
        """The classifier's tensors (`_tensors`) copied to `device` (default: its own) for eval calls of
        `_pivot_logit`: later changes to the classifier do not reach a pivot_fn made before them."""
        device = self.hidden_mean.device if device is None else device
        return tuple(t.detach().to(device=device, dtype=torch.float32, copy=True) for t in self._tensors())

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().clone() for k, v in self.state_dict().items()}  # float32: ~80 kB for H=128
        torch.save(dict(format=FORMAT, spec=self.spec, threshold=self.threshold, metrics=self.metrics,
                        n_scalars=self.scalar_mean.shape[0], state_dict=state), path)


def pivot_timer(pivot_fn, verifier, n: int, context: int = 32):
    """A step for `models.measure_step_latencies`: each call times one `pivot_fn` call on an n-draft block (the
    inputs a round of draft length n hands it: the verifier's hidden states of the classifier's layer and its
    logits, from one untimed forward made here) on the clock it is given; seconds per call."""
    from relaxspec.models.hf import synchronize

    device = verifier.device
    ids = torch.randint(2, verifier.vocab_size, (1, context + n + 1), device=device)
    positions = torch.arange(context + n + 1, device=device)[None]
    logits, hidden = verifier.forward(ids, verifier.new_cache(), None, positions,
                                      hidden_layer=getattr(pivot_fn, "hidden_layer", -1))
    block = slice(context, context + n)  # the drafts' rows: hidden after each draft, the logits that predict it
    args = (hidden[:, context + 1:], logits[:, block], logits[:, block].flip(-1).contiguous(), ids[:, context + 1:])

    def timer(clock) -> float:
        with torch.inference_mode():  # as the engine calls it (generate runs in inference mode)
            synchronize(device)
            t = clock()
            pivot_fn(*args)
            synchronize(device)
            return clock() - t

    return timer


def _pivot_logit(tensors: tuple[torch.Tensor, ...], hidden: torch.Tensor, scalars: torch.Tensor,
                 dropout: float = 0.0, training: bool = False) -> torch.Tensor:
    """The classifier as functional calls (no module calls: what the engine pays once per round): float32
    features hidden [..., H] and scalars [..., 6], standardised, projected to 64 and 16, concatenated, dropout
    (training only), Linear(80, 128), ReLU, Linear(128, 1) -> pivot logit [...]. `tensors`: `_tensors()` (the
    module's forward, training included) or their copies (`inference_weights`, pivot_fn)."""
    h_mean, h_std, h_weight, h_bias, s_mean, s_std, s_weight, s_bias, weight, bias, head_weight, head_bias = tensors
    h = F.linear((hidden - h_mean) / h_std, h_weight, h_bias)
    s = F.linear((scalars - s_mean) / s_std, s_weight, s_bias)
    joined = torch.cat([h, s], dim=-1)
    if training:
        joined = F.dropout(joined, dropout, training)
    return F.linear(F.relu(F.linear(joined, weight, bias)), head_weight, head_bias).squeeze(-1)


def load_classifier(path: str | Path) -> PivotClassifier:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no pivot classifier at {path}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a pivot classifier file")
    not_ours = f"{path} is not a relaxspec pivot classifier (format {FORMAT})"
    try:  # weights_only: a classifier file holds tensors and plain values, never code to run
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - garbage, truncated or foreign files: one clear line
        raise ValueError(not_ours) from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise ValueError(not_ours)
    spec = blob["spec"]
    if list(spec.get("feature_names", [])) != list(SCALAR_FEATURES):
        raise ValueError(f"{path} was trained on features {spec.get('feature_names')}, this version computes "
                         f"{list(SCALAR_FEATURES)}")
    clf = PivotClassifier(spec["hidden_size"], blob["n_scalars"], spec["hidden_layer"], spec)
    try:
        clf.load_state_dict({k: v.float() for k, v in blob["state_dict"].items()})
    except (RuntimeError, KeyError, AttributeError) as e:
        raise ValueError(f"{path}: damaged classifier weights ({str(e).splitlines()[0]})") from None
    clf.threshold = blob.get("threshold", 0.5)
    clf.metrics = blob.get("metrics", {})
    return clf.eval()


def roc_auc(scores, labels) -> float:
    """Area under the ROC curve = P(score of a random positive > a random negative), ties count 1/2
    (Mann-Whitney U with average ranks). NaN when only one class is present."""
    scores = torch.as_tensor(scores, dtype=torch.float64).flatten()
    labels = torch.as_tensor(labels).flatten().bool()
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = torch.argsort(scores)
    sorted_scores = scores[order]
    ranks = torch.empty_like(scores)
    n = len(scores)
    positions = torch.arange(1, n + 1, dtype=torch.float64)
    # average ranks over tie groups
    _, counts = torch.unique_consecutive(sorted_scores, return_counts=True)
    start = 0
    avg = torch.empty(n, dtype=torch.float64)
    for c in counts.tolist():
        avg[start:start + c] = positions[start:start + c].mean()
        start += c
    ranks[order] = avg
    u = ranks[labels].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def binary_metrics(probs, labels, threshold: float) -> dict:
    """Precision, recall, F1 and accuracy of `probs >= threshold` as the pivot prediction."""
    probs = torch.as_tensor(probs).flatten()
    labels = torch.as_tensor(labels).flatten().bool()
    pred = probs >= threshold
    tp = int((pred & labels).sum())
    fp = int((pred & ~labels).sum())
    fn = int((~pred & labels).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return dict(threshold=threshold, precision=precision, recall=recall, f1=f1,
                accuracy=float((pred == labels).float().mean()) if len(labels) else float("nan"))


def load_labels(path: str | Path) -> dict:
    """A labels file written by `label_pivots` (tensors and plain values only); anything else is a ValueError."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no labels file at {path}")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - garbage or truncated file: one clear line
        data = None
    if not isinstance(data, dict) or not {"hidden", "scalars", "labels", "prompt_index"} <= set(data):
        raise ValueError(f"{path} is not a labels file written by `relaxspec pivot label`")
    return data


def _load_data(data) -> dict:
    return load_labels(data) if isinstance(data, (str, Path)) else data


def split_by_prompt(prompt_index: torch.Tensor, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean masks (train, val) over candidates; whole prompts go to one side."""
    prompts = torch.unique(prompt_index)
    g = torch.Generator().manual_seed(seed)
    perm = prompts[torch.randperm(len(prompts), generator=g)]
    n_val = max(1, round(len(prompts) * val_fraction)) if len(prompts) > 1 and val_fraction > 0 else 0
    val_prompts = perm[:n_val]
    val = torch.isin(prompt_index, val_prompts)
    return ~val, val


def train_classifier(data, epochs: int = 400, lr: float = 1e-3, seed: int = 0, val_fraction: float = 0.2,
                     weight_decay: float = 1e-2, dropout: float = 0.2, inner_fraction: float = 0.2,
                     progress: bool = False) -> tuple[PivotClassifier, dict]:
    """Train a PivotClassifier on labelled candidates (a dict from `label_pivots`, or its path).

    Split by prompt: `val_fraction` of the prompts are held out and used ONLY for the report. Of the
    remaining (training) prompts, `inner_fraction` form an inner split that picks the epoch (lowest
    inner balanced loss, i.e. early stopping) and the threshold (best F1 on the inner split); with
    fewer than 5 training prompts there is no inner split (last epoch, F1 on the training split).
    Full-batch AdamW on BCE with pos_weight = n_neg / n_pos (class-balanced loss).
    The report gives precision / recall / F1 at the chosen threshold and ROC-AUC on the held-out split,
    the held-out metrics at thresholds 0.1..0.9, and each scalar feature's own held-out AUC.
    Returns (classifier, report)."""
    data = _load_data(data)
    meta = data.get("meta", {})
    hidden = data["hidden"].float()
    scalars = data["scalars"].float()
    labels = data["labels"].float()
    prompt_index = data["prompt_index"]
    if len(labels) < 2:
        raise ValueError(f"need at least 2 labelled candidates to train, got {len(labels)}")
    train, val = split_by_prompt(prompt_index, val_fraction, seed)
    if not train.any():
        raise ValueError("the training split is empty")
    fit, inner = train.clone(), torch.zeros_like(train)
    if torch.unique(prompt_index[train]).numel() >= 5 and inner_fraction > 0:
        sub_fit, sub_inner = split_by_prompt(prompt_index[train], inner_fraction, seed + 1)
        fit[train], inner[train] = sub_fit, sub_inner
    torch.manual_seed(seed)
    spec = {k: meta.get(k) for k in ("verifier", "drafter", "task", "k", "alpha", "margin", "min_prob",
                                     "verifier_fingerprint", "drafter_fingerprint", "weight_format")}
    clf = PivotClassifier(hidden.shape[1], scalars.shape[1], int(meta.get("hidden_layer", -1)), spec, dropout)
    clf.set_normalisation(hidden[train], scalars[train])
    n_pos = float(labels[fit].sum())
    n_neg = float(len(labels[fit]) - n_pos)
    pos_weight = torch.tensor(n_neg / n_pos if n_pos > 0 and n_neg > 0 else 1.0)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    opt = torch.optim.AdamW(clf.parameters(), lr=lr, weight_decay=weight_decay)
    h_fit, s_fit, y_fit = hidden[fit], scalars[fit], labels[fit]
    best_loss, best_state, best_epoch = math.inf, None, epochs
    for epoch in range(1, epochs + 1):
        clf.train()
        opt.zero_grad()
        loss = loss_fn(clf(h_fit, s_fit), y_fit)
        loss.backward()
        opt.step()
        if inner.any():
            clf.eval()
            with torch.no_grad():
                inner_loss = float(loss_fn(clf(hidden[inner], scalars[inner]), labels[inner]))
            if inner_loss < best_loss:
                best_loss, best_epoch = inner_loss, epoch
                best_state = {k: v.detach().clone() for k, v in clf.state_dict().items()}
    if best_state is not None:
        clf.load_state_dict(best_state)
    clf.eval()
    pick = inner if inner.any() else fit
    with torch.no_grad():
        prob = lambda m: torch.sigmoid(clf(hidden[m], scalars[m])) if m.any() else torch.zeros(0)  # noqa: E731
        p_fit, p_pick, p_val = prob(fit), prob(pick), prob(val)
    grid = [round(0.05 * i, 2) for i in range(1, 20)]
    best = max(grid, key=lambda t: (binary_metrics(p_pick, labels[pick], t)["f1"], -abs(t - 0.5)))
    clf.threshold = best
    report = dict(
        n_train=int(train.sum()), n_val=int(val.sum()), n_inner=int(inner.sum()),
        prompts_train=int(torch.unique(prompt_index[train]).numel()),
        prompts_val=int(torch.unique(prompt_index[val]).numel()) if val.any() else 0,
        pivot_rate_train=float(labels[train].mean()), pivot_rate_val=float(labels[val].mean()) if val.any() else math.nan,
        best_epoch=best_epoch, final_train_loss=float(loss.detach()), threshold=best,
        train=dict(**binary_metrics(p_fit, y_fit, best), roc_auc=roc_auc(p_fit, y_fit)),
        val=dict(**binary_metrics(p_val, labels[val], best), roc_auc=roc_auc(p_val, labels[val]))
        if val.any() else None,
        val_by_threshold=[binary_metrics(p_val, labels[val], t) for t in (0.1, 0.3, 0.5, 0.7, 0.9)]
        if val.any() else [],
        scalar_auc_val={name: roc_auc(scalars[val][:, i], labels[val]) for i, name in enumerate(SCALAR_FEATURES)}
        if val.any() else {},
    )
    clf.metrics = report
    return clf, report
