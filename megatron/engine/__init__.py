"""The DeepSpeed adapter: the only package that imports deepspeed or knows its internals.

    engine.py         Engine: deepspeed.initialize around the module it is given (built by
                      training/startup.py); train/eval steps; the training state for
                      checkpoints
    model.py          how DeepSpeed sees the model: pipeline layer specs, tensor-parallel markers
    state.py          where DeepSpeed's optimizers keep master weights and Adam moments
    optimizer.py      the torch AdamW and LR schedule handed to DeepSpeed
    mpu.py            the mpu object DeepSpeed asks for process groups
    experts.py        how DeepSpeed reduces experts split over ranks (MoE markers, groups,
                      ZeRO-0's clipping norm)
    deepspeed_json.py the generated deepspeed.json (torch- and DeepSpeed-free: the planner
                      imports it)
    optimizer_kind.py which optimizer wrapper DeepSpeed runs for a precision, ZeRO stage and
                      pipeline size (torch- and DeepSpeed-free: the planner imports it)
    runners.py        how each pipeline schedule's record (config/schedules) is run: DeepSpeed's
                      own TrainSchedule, or zero_bubble.py over pipe_order.py (torch-free)
    chunks.py         interleaved pipelines: this rank's model chunks and the groups DeepSpeed
                      sees for them; interleaved_order.py interleaved 1F1B's order and
                      v_order.py ZB-V's (torch-free); interleaved.py the executor of both over
                      a plain DeepSpeed engine

Importing this package imports nothing else: the planner, which is torch-free, reads
deepspeed_json and optimizer_kind from it."""
