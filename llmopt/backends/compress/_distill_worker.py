"""One process of data-parallel distillation, started by torchrun from ``_distill.train_distributed``.

    python -m torch.distributed.run --standalone --nproc_per_node N -m llmopt.backends.compress._distill_worker SPEC

SPEC is the JSON file the stage wrote: the student's and teacher's folders, the distill options, the
training rows (safetensors), the checkpoint folder and the checkpoint to resume from. torchrun sets
RANK, LOCAL_RANK and WORLD_SIZE; ``Trainer`` (through accelerate) joins the process group (NCCL on GPUs,
gloo on the CPU), wraps the student in DistributedDataParallel and gives each process its share of every
batch. Rank 0 prints the progress lines the stage forwards, and at the end saves the student (safetensors)
and the loss history to the spec's ``out`` folder.
Needs: torch, transformers, accelerate, safetensors.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import torch
    from safetensors.torch import load_file

    from llmopt.backends.compress import _distill
    from llmopt.backends.compress.distill import DistillOptions

    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if spec["device"] == "cuda":
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    else:
        device = "cpu"
        torch.set_num_threads(spec["threads"] or 1)
        from accelerate import PartialState

        # Join torchrun's gloo group as Trainer would, and name the device "cpu": accelerate calls it "cpu:0",
        # and Trainer maps a resumed optimizer state to that name, which torch.load cannot restore to. Trainer
        # is then told to use this state (use_configured_state) rather than build its own.
        PartialState(cpu=True).device = torch.device("cpu")
    options = DistillOptions(**spec["options"])
    _, student, teacher = _distill.load_pair(Path(spec["student"]), Path(spec["teacher"]), spec["trust_remote_code"],
                                            device, spec["bf16"], spec["name"])
    rows = load_file(spec["rows"])["input_ids"]

    def progress(message: str) -> None:
        if rank == 0:
            print(_distill.PROGRESS + message, flush=True)

    trainer = _distill.build_trainer(options, spec["name"], progress, device, student, teacher, rows,
                                     Path(spec["checkpoints"]), spec["bf16"], configured_state=device == "cpu")
    if rank == 0:
        progress(f"{trainer.args.world_size} data-parallel processes ({trainer.args.parallel_mode.value})")
    trainer.train(resume_from_checkpoint=spec["resume"])
    if trainer.is_world_process_zero():
        out = Path(spec["out"])
        trainer.model.save_pretrained(out, safe_serialization=True)
        history = _distill.loss_history(trainer)
        (out / "history.json").write_text(json.dumps(history, indent=1) + "\n")  # written last: the stage's sign
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1])
