"""The ``train`` section: the optimisation (the cross-entropy stage, then optionally the self-critical
one), and the self-critical reward it names."""

from __future__ import annotations

from dataclasses import dataclass

from captioning.config.fields import OutputFolder, check, check_types, one_of

__all__ = ["PER_STEP_SCHEDULES", "SCHEDULES", "TrainConfig", "reward_description"]

SCHEDULES = ("none", "step", "plateau", "noam", "cosine")
PER_STEP_SCHEDULES = ("noam", "cosine")  # the others step once per epoch


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation: cross-entropy stage, then optionally self-critical."""

    output_dir: OutputFolder = "runs/shapes"  # checkpoints, logs, results and figures go here
    overwrite: bool = False  # another run's outputs in output_dir are deleted; else refused
    resume: str = "none"  # none | auto: continue from output_dir's checkpoints/last.pt if there is one
    epochs: int = 4  # cross-entropy epochs
    batch_size: int = 32  # images per batch (each brings all its captions)
    captions_per_image: int = 5  # captions of an image used per step (seq_per_img)
    lr: float = 4e-4  # decoder learning rate (Adam), cross-entropy stage
    encoder_lr: float = 1e-4  # used when model.encoder.fine_tune_stages > 0
    weight_decay: float = 0.0  # Adam weight decay
    adam_beta2: float = 0.999  # Adam's second-moment decay (Transformer recipes use 0.98)
    grad_clip: float = 5.0  # max gradient norm; 0 disables
    label_smoothing: float = 0.0  # cross-entropy label smoothing
    ema_decay: float = 0.0  # validate and keep a moving average of the weights (e.g. 0.998); 0 = off
    schedule: str = "plateau"  # none | step | plateau (per epoch) | noam | cosine (per step, after warm-up)
    warmup_steps: int = 4000  # noam, cosine: steps of linear warm-up to train.lr
    step_size: int = 3  # epochs between decays (step)
    gamma: float = 0.8  # decay factor (step and plateau)
    plateau_patience: int = 2  # epochs without improvement before a plateau decay
    early_stop_patience: int = 5  # epochs without improvement of `metric`; 0 disables
    metric: str = "CIDEr-D"  # validation metric for the best checkpoint and early stopping (Java-less)
    val_images: int = 0  # validate on the first N validation images; 0 = all
    seed: int = 0  # seeds Python, NumPy, torch and the batch order
    deterministic: bool = False  # deterministic algorithms (exact resume on CPU)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: str = "none"  # none | bf16 (GPU or CPU) | fp16 (GPU): autocast in training and validation
    compile: bool = False  # torch.compile the decoder step (helps on GPU; slow to compile on CPU)
    checkpoint_every: int = 0  # also checkpoint every N steps; 0 = once per epoch
    nonfinite: str = "stop"  # stop | skip: what a non-finite loss does
    max_steps: int = 0  # stop after N optimisation steps in total (tests, smoke runs); 0 = no limit
    log_every: int = 20  # TensorBoard scalars every N steps
    # Self-critical sequence training (Rennie et al. 2017), after the cross-entropy epochs.
    scst_epochs: int = 0  # self-critical epochs after the cross-entropy epochs
    scst_lr: float = 2e-5  # self-critical stage's rate (a fine-tuned encoder's: encoder_lr * scst_lr / lr)
    scst_baseline: str = "greedy"  # greedy | mean (mean reward of the other samples)
    scst_samples: int = 5  # sampled captions per image
    scst_reward_eos: bool = True  # the CIDEr-D reward counts <end> (Rennie et al.); false: the older reward
    # The faithfulness study of the test split after scoring it (evaluate.py --faithfulness's defaults):
    # its table in test_scores.json, its page in test_faithfulness.html (docs/attention-and-report.md).
    faithfulness: bool = False  # end the run with the study
    faithfulness_images: int = 0  # explain the first N test images; 0 = all
    faithfulness_methods: str = "default"  # comma-separated methods; default: all that fit the model
    faithfulness_pixel_steps: int = 0  # also RISE's pixel-space curves in N steps; 0 = the grid's only

    def __post_init__(self) -> None:
        check_types(self, "train.")
        check(self.epochs >= 0, f"train.epochs must be >= 0, got {self.epochs}")
        check(self.batch_size >= 1, f"train.batch_size must be >= 1, got {self.batch_size}")
        check(self.captions_per_image >= 1, "train.captions_per_image must be >= 1")
        for name in ("lr", "encoder_lr", "scst_lr"):
            check(getattr(self, name) > 0, f"train.{name} must be > 0, got {getattr(self, name)}")
        check(self.weight_decay >= 0, "train.weight_decay must be >= 0")
        check(0.0 <= self.adam_beta2 < 1.0, f"train.adam_beta2 must be in [0, 1), got {self.adam_beta2}")
        check(self.grad_clip >= 0, "train.grad_clip must be >= 0")
        check(0.0 <= self.label_smoothing < 1.0, "train.label_smoothing must be in [0, 1)")
        check(0.0 <= self.ema_decay < 1.0, f"train.ema_decay must be in [0, 1), got {self.ema_decay}")
        one_of("train.schedule", self.schedule, SCHEDULES)
        check(self.warmup_steps >= 1, f"train.warmup_steps must be >= 1, got {self.warmup_steps}")
        check(self.step_size >= 1, "train.step_size must be >= 1")
        check(0 < self.gamma <= 1, "train.gamma must be in (0, 1]")
        check(self.early_stop_patience >= 0, "train.early_stop_patience must be >= 0")
        one_of("train.resume", self.resume, ("none", "auto"))
        check(0 <= self.seed < 2**32, f"train.seed must be in [0, 2**32 - 1], got {self.seed}")
        one_of("train.amp", self.amp, ("none", "bf16", "fp16"))
        one_of("train.nonfinite", self.nonfinite, ("stop", "skip"))
        one_of("train.scst_baseline", self.scst_baseline, ("greedy", "mean"))
        check(self.scst_samples >= 1, f"train.scst_samples must be >= 1, got {self.scst_samples}")
        check(
            self.scst_samples >= 2 or self.scst_baseline == "greedy",
            "train.scst_samples must be >= 2 with the mean baseline",
        )
        for name in (
            "checkpoint_every",
            "max_steps",
            "val_images",
            "scst_epochs",
            "faithfulness_images",
            "faithfulness_pixel_steps",
        ):
            check(getattr(self, name) >= 0, f"train.{name} must be >= 0")
        check(self.log_every >= 1, "train.log_every must be >= 1")


def reward_description(train: TrainConfig) -> str:
    """The self-critical reward a training configuration uses: ``cider-d.eos`` or ``cider-d.noeos``."""
    return "cider-d.eos" if train.scst_reward_eos else "cider-d.noeos"
