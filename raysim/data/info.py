"""``raysim data info``: what a scenario's federated data looks like before anything trains.

``describe`` builds one source as a run would (files parsed into their cache, a pooled dataset
partitioned) and reads every client's split sizes and label counts; ``text`` prints them and
``plot`` draws them (client sizes, the label histogram, the clients x classes heat map).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .base import FederatedSource


@dataclass
class DataInfo:
    dataset: str
    clients: int
    input_shape: tuple[int, ...]
    input_kind: str
    task: str
    classes: int
    names: list[str | None]
    train: np.ndarray  # per client
    val: np.ndarray
    test: np.ndarray
    labels: np.ndarray | None  # (clients, classes) train label counts; None for regression
    class_names: list[str] | None = None
    notes: list[str] = field(default_factory=list)

    def label(self, k: int) -> str:
        return self.class_names[k] if self.class_names else str(k)


def describe(name: str, source: FederatedSource) -> DataInfo:
    """Every client's split sizes and train label counts."""
    source.prepare()
    n = source.num_clients
    classification = source.task == "classification"
    train, val, test = (np.zeros(n, dtype=np.int64) for _ in range(3))
    labels = np.zeros((n, source.num_classes), dtype=np.int64) if classification else None
    names: list[str | None] = []
    for c in range(n):
        d = source.client(c)
        train[c], val[c], test[c] = d.num_train, d.num_val, d.num_test
        if labels is not None:
            labels[c] = np.bincount(d.train_y.numpy().reshape(-1), minlength=source.num_classes)
        names.append(source.client_name(c))
    return DataInfo(
        name,
        n,
        tuple(source.input_shape),
        getattr(source, "input_kind", "features"),
        source.task,
        source.num_classes,
        names,
        train,
        val,
        test,
        labels,
        getattr(source, "class_names", None),
    )


def _stats(a: np.ndarray) -> str:
    return f"min {a.min()}, median {int(np.median(a))}, mean {a.mean():.1f}, max {a.max()}" if len(a) else "none"


def text(info: DataInfo, show: int = 10) -> str:
    """A few lines a person reads: sizes, label balance, the first clients."""
    total = info.train + info.val + info.test
    what = "token ids" if info.input_kind == "tokens" else "features"
    out = [
        f"{info.dataset}: {info.clients} clients, inputs {info.input_shape} ({what}), "
        f"{info.classes} {'classes' if info.task == 'classification' else 'outputs'} ({info.task})",
        f"samples: {int(total.sum())} (train {int(info.train.sum())}, val {int(info.val.sum())}, "
        f"test {int(info.test.sum())})",
        f"per client: {_stats(total)}; train {_stats(info.train)}",
    ]
    if info.labels is not None:
        overall = info.labels.sum(0)
        share = overall / max(overall.sum(), 1)
        order = np.argsort(-overall, kind="stable")
        top = ", ".join(f"{info.label(k)}: {share[k]:.1%}" for k in order[:10] if overall[k])
        out.append(f"train labels: {int((overall > 0).sum())} of {info.classes} classes present; most frequent {top}")
        present = (info.labels > 0).sum(1)
        majority = info.labels.max(1) / np.maximum(info.labels.sum(1), 1)
        out.append(
            f"label skew: classes per client {_stats(present)}; the majority class holds "
            f"{majority.mean():.1%} of a client's train samples on average"
        )
    width = max([len(str(n)) for n in info.names[:show] if n] + [6])
    out.append(
        f"{'client':>6}  {'name':<{width}}  {'train':>7} {'val':>6} {'test':>6}"
        + ("  labels (most frequent: share)" if info.labels is not None else "")
    )
    for c in range(min(show, info.clients)):
        row = f"{c:>6}  {str(info.names[c] or '-'):<{width}}  {info.train[c]:>7} {info.val[c]:>6} {info.test[c]:>6}"
        if info.labels is not None:
            lab = info.labels[c]
            k = int(np.argmax(lab))
            row += f"  {int((lab > 0).sum())} classes ({info.label(k)}: {lab[k] / max(lab.sum(), 1):.0%})"
        out.append(row)
    if info.clients > show:
        out.append(f"   ... {info.clients - show} more clients")
    return "\n".join(out + info.notes)


def plot(info: DataInfo, path: str, max_rows: int = 100) -> None:
    """A PNG: samples per client, the overall label histogram and (classification) the
    clients x classes share of each client's train labels (the first ``max_rows`` clients)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 3 if info.labels is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.5), squeeze=False)
    ax = axes[0][0]
    total = info.train + info.val + info.test
    ax.hist(total, bins=min(50, max(5, info.clients // 2)), color="#4c72b0")
    ax.set(title=f"{info.dataset}: samples per client ({info.clients} clients)", xlabel="samples", ylabel="clients")
    if info.labels is not None:
        overall = info.labels.sum(0)
        axes[0][1].bar(np.arange(info.classes), overall, color="#55a868")
        axes[0][1].set(title="train labels, all clients", xlabel="class", ylabel="samples")
        rows = info.labels[:max_rows]
        share = rows / np.maximum(rows.sum(1, keepdims=True), 1)
        im = axes[0][2].imshow(share, aspect="auto", interpolation="nearest", cmap="viridis")
        axes[0][2].set(title=f"label share per client (first {len(rows)})", xlabel="class", ylabel="client")
        fig.colorbar(im, ax=axes[0][2], fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
