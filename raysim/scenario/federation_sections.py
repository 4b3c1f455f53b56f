"""The sections that change how a client's update reaches the server (or its neighbours), as
dataclasses with each key's type, range and help: ``topology`` (gossip instead of a server),
``server`` (a server optimizer), ``privacy`` (differential privacy), ``communication``
(compressed uploads) and ``systems`` (a simulated fleet on a virtual clock, its distributions
``DistCfg``). ``raysim.scenario.federation_checks`` checks them against the method;
``raysim.scenario.sections`` holds the other sections and re-exports these.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TopologyCfg:
    """Decentralized training: clients gossip with graph neighbours instead of a server."""

    kind: str = field(
        default="erdos_renyi",
        metadata={
            "choices": ("erdos_renyi", "ring", "torus", "complete", "star", "edges"),
            "help": "the communication graph: erdos_renyi (G(n, p), connected), ring, torus (2-D periodic r x c "
            "grid, r, c ≥ 3), complete, star (client 0 at the centre) or edges (the file topology.edges)",
        },
    )
    p: float = field(default=0.5, metadata={"gt": 0.0, "max": 1.0, "help": "Erdős–Rényi edge probability"})
    resample: bool = field(default=False, metadata={"help": "draw a new Erdős–Rényi graph every round"})
    connect: str = field(
        default="redraw",
        metadata={
            "choices": ("redraw", "bridge"),
            "help": "Erdős–Rényi: redraw until connected, or bridge one draw's components in a chain "
            "(needed at a sparse average degree on many clients)",
        },
    )
    mixing: str = field(
        default="metropolis",
        metadata={
            "choices": ("metropolis", "fmmc"),
            "help": "the gossip matrix W on the graph: metropolis (W_ij = 1/(1 + max(d_i, d_j)), Xiao & Boyd) or "
            "fmmc (the fastest-mixing Markov chain, Boyd, Diaconis & Xiao; at most 3000 clients)",
        },
    )
    fmmc_iters: int = field(
        default=1000,
        metadata={
            "min": 1,
            "help": "FMMC: projected-subgradient iterations, one eigendecomposition of W each "
            "(300 clients: about 6 s for 1000; lower it with resample: true)",
        },
    )
    weighting: str = field(
        default="uniform",
        metadata={
            "choices": ("uniform", "samples"),
            "help": "uniform: the symmetric doubly stochastic W (the paper's; gossip keeps the plain average "
            "of the clients); samples: W reweighted by Metropolis-Hastings towards the clients' "
            "training-sample counts (gossip keeps the sample-weighted average, as FedEM's server)",
        },
    )
    edges: str | None = field(default=None, metadata={"help": "file of 'i j' client-id pairs (kind: edges)"})
    link_failure: float = field(
        default=0.0,
        metadata={
            "min": 0.0,
            "lt": 1.0,
            "help": (
                "probability that a link fails in a round (drawn per edge and round from the seed); W is rebuilt "
                "each round by Metropolis on the links that work (a client without any keeps its parameters)"
            ),
        },
    )
    node_failure: float = field(
        default=0.0,
        metadata={
            "min": 0.0,
            "lt": 1.0,
            "help": (
                "probability that a client is unavailable in a round: it neither trains nor mixes, and its links are "
                "down with it"
            ),
        },
    )


@dataclass(frozen=True)
class ServerCfg:
    """The server optimizer of a method with a global model (Reddi et al., "Adaptive Federated
    Optimization", ICLR 2021, Algorithm 2): the round's aggregate minus the previous global model
    is a pseudo-gradient Δ, and the server steps the global model with it (how-to: server
    optimizers). none: the global model is the aggregate, as each method defines it."""

    optimizer: str = field(
        default="none",
        metadata={
            "choices": ("none", "sgd", "adam", "yogi", "adagrad"),
            "help": "none: the method's own aggregate; sgd: FedAvgM (v ← momentum·v + Δ, x ← x + lr·v); adam, yogi, "
            "adagrad: FedAdam, FedYogi, FedAdagrad (m ← β₁m + (1−β₁)Δ, v per the optimizer, "
            "x ← x + lr·m/(√v + τ)). Only for a method with a global model, without a topology",
        },
    )
    lr: float | None = field(
        default=None,
        metadata={
            "gt": 0.0,
            "help": ("η, the server learning rate (tune it); null: sgd 1, adam and yogi 0.01, adagrad 0.1"),
        },
    )
    momentum: float = field(
        default=0.9,
        metadata={
            "min": 0.0,
            "lt": 1.0,
            "help": (
                "β, sgd's server momentum (FedAvgM; 0.9 as Hsu et al. 2019; 0 with lr 1 is the method's own aggregate)"
            ),
        },
    )
    beta1: float = field(
        default=0.9,
        metadata={
            "min": 0.0,
            "lt": 1.0,
            "help": ("β₁, the adaptive optimizers' first-moment decay (Reddi et al.: 0.9)"),
        },
    )
    beta2: float = field(
        default=0.99,
        metadata={
            "min": 0.0,
            "lt": 1.0,
            "help": ("β₂, adam's and yogi's second-moment decay (Reddi et al.: 0.99; adagrad ignores it)"),
        },
    )
    tau: float = field(
        default=1e-3,
        metadata={
            "gt": 0.0,
            "help": ("τ, the adaptivity: x ← x + η m/(√v + τ), and v starts at τ² (Reddi et al.: 1e-3)"),
        },
    )


@dataclass(frozen=True)
class PrivacyCfg:
    """Differential privacy (how-to: differential privacy). ``level: client`` (DP-FedAvg,
    McMahan et al., ICLR 2018): each client's update clipped to L2 norm ``clip`` on its host,
    Gaussian noise of std ``noise_multiplier`` x ``clip`` added to their sum by the server, which
    divides by the clients a round samples. ``level: sample`` (DP-SGD, Abadi et al., CCS 2016):
    every local step clips each sample's gradient to ``clip`` and adds noise of std
    ``noise_multiplier`` x ``clip`` to their sum. ε is logged every round (``dp_epsilon``)."""

    level: str = field(
        default="client",
        metadata={
            "choices": ("client", "sample"),
            "help": "client: one client's whole data is what is protected (DP-FedAvg: clipped updates, noise at the "
            "server); sample: one training sample is (DP-SGD in every local step: per-sample clipping, noise "
            "on the client)",
        },
    )
    clip: float = field(
        default=1.0,
        metadata={
            "gt": 0.0,
            "max": 1e6,
            "help": (
                "C, the largest L2 norm of a client's update (level client: trained model minus the model it received, "
                "all of its floating-point tensors as one vector; target_quantile adapts it, or a run with "
                "debug_exact_metrics logs the norms to choose it from) "
                "or of one sample's gradient (level sample)"
            ),
        },
    )
    noise_multiplier: float = field(
        default=1.0,
        metadata={
            "min": 0.0,
            "max": 1e6,
            "help": (
                "z: the noise added to the sum of clipped updates (or of a batch's clipped gradients) has std z·C "
                "(0: clipping only, no guarantee; else at least 0.01, below which ε is in the hundreds of thousands)"
            ),
        },
    )
    delta: float | None = field(
        default=None,
        metadata={
            "gt": 0.0,
            "lt": 1.0,
            "help": (
                "δ of the (ε, δ) reported; null: N^-1.1 for N training clients (level sample: n^-1.1 for the largest "
                "client's n training samples)"
            ),
        },
    )
    target_quantile: float | None = field(
        default=None,
        metadata={
            "gt": 0.0,
            "lt": 1.0,
            "help": (
                "γ: adapt C each round towards the γ-quantile of the update norms (Andrew et al., NeurIPS 2021; "
                "they use 0.5), from a noisy count of the unclipped updates; null: C stays at clip"
            ),
        },
    )
    clip_lr: float = field(
        default=0.2,
        metadata={
            "gt": 0.0,
            "max": 10.0,
            "help": ("η_C, adaptive clipping's step: C ← C·exp(−η_C (b̃ − γ)), b̃ the noisy share of unclipped updates"),
        },
    )
    count_noise: float | None = field(
        default=None,
        metadata={
            "gt": 0.0,
            "help": (
                "σ_b, the std of the noise on the count of unclipped updates (adaptive clipping); null: K/20, the "
                "paper's; it takes a share of noise_multiplier's budget: the updates' noise is z_Δ·C with "
                "z_Δ = (z^-2 − (2σ_b)^-2)^-1/2"
            ),
        },
    )
    debug_exact_metrics: bool = field(
        default=False,
        metadata={
            "help": (
                "debugging only: also log what privacy otherwise keeps on the hosts, each computed exactly from the "
                "clients' training data: the mean training loss (train_loss), the share of updates clipped (dp_clipped) "
                "and their mean norm before clipping (dp_update_norm); nothing logged then has a guarantee, so "
                "dp_epsilon is inf (dp_epsilon_model: the model's own ε)"
            )
        },
    )
    batches: str | None = field(
        default=None,
        metadata={
            "choices": ("shuffle", "poisson"),
            "help": "level sample: how DP-SGD forms a step's batch. shuffle (null's choice): fixed-size batches of "
            "each shuffled epoch, accounted as if Poisson-sampled, as most DP-SGD papers and libraries report "
            "(for shuffling that figure can under-state ε); poisson: each sample joins each step with "
            "probability B/n, independently, what the accountant assumes, so ε is exact (batch sizes vary; "
            "rows are padded to a fixed width, 2-4x the work of a batch of B)",
        },
    )
    accounting: str | None = field(
        default=None,
        metadata={
            "choices": ("sampled", "poisson"),
            "help": "level client: sampled (null's choice): K of N clients without replacement, one client's data "
            "replaced (raysim's sampling; sensitivity 2C); poisson: each client in a round with probability "
            "K/N, one client added or removed (the usual DP-FedAvg statement, to compare with published ε). "
            "level sample: poisson only (null's choice): each batch as if each sample joined it with "
            "probability B/n, the statement Opacus and DP-SGD papers make for shuffled batches",
        },
    )


@dataclass(frozen=True)
class CommunicationCfg:
    """Compressed uploads (raysim/federation/compression.py; how-to: compressed uploads): each client sends
    its update through a compressor and the server averages what it reconstructs; the bytes the
    clients would send are logged every round (``upload_bytes``)."""

    compress: str = field(
        default="none",
        metadata={
            "choices": ("none", "qsgd", "topk", "randk"),
            "help": "none: the update as it is (4 bytes a number); qsgd: stochastic quantization to levels "
            "(Alistarh et al. 2017; FedAvg with it is FedPAQ); topk: the ratio of largest-magnitude "
            "coordinates; randk: a random ratio of coordinates, scaled to stay unbiased",
        },
    )
    levels: int = field(default=16, metadata={"min": 1, "help": "qsgd: s, the quantization levels of |v_i|/‖u‖"})
    bucket: int | None = field(
        default=512,
        metadata={
            "min": 0,
            "help": (
                "qsgd: b, the consecutive coordinates u of the update that share one norm ‖u‖ (32 bits each); 0 or "
                "null: the whole update, one norm (how-to: compressed uploads)"
            ),
        },
    )
    ratio: float = field(
        default=0.01,
        metadata={"gt": 0.0, "max": 1.0, "help": ("topk and randk: the share of the update's coordinates sent")},
    )
    gossip_step: float | None = field(
        default=None,
        metadata={
            "gt": 0.0,
            "max": 1.0,
            "help": (
                "with a topology (CHOCO-gossip, Koloskova et al. 2019): γ, the consensus step x_i ← x_i + γ Σ_j w_ij "
                "(x̂_j − x̂_i) on the neighbours' public copies; required there (1 with compress none is plain gossip; "
                "the paper tunes it per compressor, smaller for stronger compression); not without a topology"
            ),
        },
    )
    error_feedback: bool = field(
        default=False,
        metadata={
            "help": (
                "each client adds what its compressor dropped last round before compressing, and keeps the new "
                "remainder (Stich et al. 2018; Karimireddy et al. 2019); topk and randk only (randk then sends its "
                "values unscaled); advised for topk"
            )
        },
    )


@dataclass(frozen=True)
class DistCfg:
    """A distribution over the fleet's clients, drawn once per run from (seed, "systems")."""

    dist: str = field(
        default="constant",
        metadata={
            "choices": ("constant", "uniform", "lognormal"),
            "help": "constant (value), uniform (low..high) or lognormal (median value, log-scale std sigma: "
            "sigma 1 puts a tenth of the fleet 3.6x below the median, a long tail)",
        },
    )
    value: float = field(default=1.0, metadata={"min": 0.0, "help": "constant: the value; lognormal: the median"})
    low: float = field(default=0.0, metadata={"min": 0.0, "help": "uniform: the lowest value"})
    high: float = field(default=1.0, metadata={"min": 0.0, "help": "uniform: the highest value"})
    sigma: float = field(default=1.0, metadata={"min": 0.0, "help": "lognormal: the std of the log-values"})


@dataclass(frozen=True)
class SystemsCfg:
    """A simulated fleet on a virtual clock (raysim/federation/fleet.py): each client's device speed and
    links, who is online, dropouts, a round deadline and over-selection. Every value is drawn
    from the seed: runs stay identical for any number of hosts. Without this section every
    client is always online, equally fast, and a round waits for everyone."""

    speed: DistCfg = field(
        default_factory=lambda: DistCfg("constant", 100.0),
        metadata={"help": ("training samples a client's device processes a second {dist, value, low, high, sigma}")},
    )
    down: DistCfg = field(
        default_factory=lambda: DistCfg("constant", 20.0),
        metadata={"help": ("download bandwidth, Mbit/s {dist, value, low, high, sigma}")},
    )
    up: DistCfg = field(
        default_factory=lambda: DistCfg("constant", 5.0),
        metadata={"help": ("upload bandwidth, Mbit/s {dist, value, low, high, sigma}")},
    )
    latency: DistCfg = field(
        default_factory=lambda: DistCfg("constant", 0.05),
        metadata={"help": ("one-way latency of each transfer, s {dist, value, low, high, sigma}")},
    )
    device_trace: str | None = field(
        default=None,
        metadata={
            "help": (
                "CSV of device profiles in place of the distributions: header client,speed,down_mbps,up_mbps,"
                "latency_s, a row for each client 0..N-1"
            )
        },
    )
    availability: str = field(
        default="always",
        metadata={
            "choices": ("always", "probability", "diurnal", "trace"),
            "help": "who can be selected at a round's start: always; probability (each client online with "
            "available_p, drawn each round); diurnal (each client online for online x period_s a cycle, "
            "at a seeded phase; a client that goes offline mid-round drops out); trace (the intervals of "
            "availability_trace)",
        },
    )
    available_p: float = field(
        default=0.5,
        metadata={
            "gt": 0.0,
            "max": 1.0,
            "help": ("availability: probability, the chance a client is online at a round's start"),
        },
    )
    period_s: float = field(
        default=86400.0,
        metadata={
            "gt": 0.0,
            "help": (
                "diurnal: the cycle's length in virtual seconds (a day); trace: the period the trace repeats with "
                "(trace_repeats), for each client whose rows give no period_s of their own"
            ),
        },
    )
    online: float = field(
        default=0.5, metadata={"gt": 0.0, "max": 1.0, "help": ("diurnal: the share of the cycle each client is online")}
    )
    availability_trace: str | None = field(
        default=None,
        metadata={
            "help": (
                "availability: trace: CSV with header client,start_s,end_s (and optionally period_s, a client's own "
                "period), the intervals (virtual seconds) in which each client is online"
            )
        },
    )
    trace_repeats: bool = field(
        default=True,
        metadata={
            "help": (
                "availability: trace: the trace repeats, every client's with its period_s column or else period_s "
                "(false: it plays once; after its last interval nobody is online)"
            )
        },
    )
    dropout: float = field(
        default=0.0,
        metadata={
            "min": 0.0,
            "lt": 1.0,
            "help": (
                "probability that a selected client drops out during a round (drawn each round; the server "
                "hears nothing from it)"
            ),
        },
    )
    deadline_s: float | None = field(
        default=None,
        metadata={
            "gt": 0.0,
            "help": (
                "the round's deadline in virtual seconds: a client whose download, training and upload take longer "
                "is a straggler and its update is dropped (null: the server waits for every client)"
            ),
        },
    )
    stragglers: str = field(
        default="drop",
        metadata={
            "choices": ("drop", "partial"),
            "help": "with a deadline: drop a straggler's update, or partial: it trains the share of its local steps "
            "that fits in the deadline after its transfers (FedProx's variable work; fednova normalizes such "
            "updates), at least one step; a straggler whose transfers alone miss the deadline is dropped",
        },
    )
    over_selection: float = field(
        default=1.0,
        metadata={
            "min": 1.0,
            "help": (
                "invite ceil(K x this) clients (K: the sampling section's count or fraction) and keep the first K "
                "replies (Bonawitz et al. 2019 use 1.3)"
            ),
        },
    )
    aggregation: str = field(
        default="sync",
        metadata={
            "choices": ("sync", "fedbuff", "fedasync"),
            "help": "sync: rounds (the server waits, with the deadline and over-selection above); fedbuff (Nguyen et "
            "al. 2022): K clients (sampling's count or fraction) train at any time, each from the model of "
            "when it started, and the server steps after every buffer replies; fedasync (Xie et al. 2019): "
            "the server mixes in each reply as it arrives. A round is then one server step",
        },
    )
    buffer: int = field(
        default=10,
        metadata={
            "min": 1,
            "help": ("fedbuff: replies per server step (the paper's K; at most the clients training at once)"),
        },
    )
    server_lr: float = field(
        default=1.0,
        metadata={
            "gt": 0.0,
            "help": (
                "fedbuff: η_g, x ← x + η_g · Σ_k s(τ_k) Δ_k / K over the buffer's updates Δ_k (FedBuff's server step)"
            ),
        },
    )
    alpha: float = field(
        default=0.6,
        metadata={
            "gt": 0.0,
            "max": 1.0,
            "help": (
                "fedasync: α, the mixing weight x ← (1 − α_t) x + α_t x_k with α_t = α · s(τ) (Xie et al. use 0.6 to 0.9)"
            ),
        },
    )
    staleness: str = field(
        default="polynomial",
        metadata={
            "choices": ("constant", "polynomial", "hinge"),
            "help": "s(τ), the weight of a reply τ server steps stale: constant 1; polynomial (1 + τ)^−a (FedBuff's "
            "1/√(1+τ) with a = 0.5); hinge 1 for τ ≤ b, else 1 / (a (τ − b) + 1) (FedAsync's)",
        },
    )
    staleness_a: float = field(default=0.5, metadata={"min": 0.0, "help": "a of the staleness function"})
    staleness_b: float = field(default=4.0, metadata={"min": 0.0, "help": "b of the hinge staleness function"})
