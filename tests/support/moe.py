"""The MoE training settings the distributed MoE tests share (test_model_moe.py,
test_checkpoint_moe.py): fp32, dropless, no dropout, clipping on, 10 steps of 8 samples."""

MOE = ["model.num_experts=4", "model.moe_top_k=2", "model.moe_aux_loss_coeff=0.01",
       "model.moe_z_loss_coeff=0.001", "model.moe_layer_freq=2",
       "training.precision=fp32", "training.train_iters=10", "training.global_batch_size=8",
       "training.micro_batch_size=2", "training.tensorboard=false", "training.clip_grad=0.5",
       "model.hidden_dropout=0.0", "model.attention_dropout=0.0", "training.check_node=false",
       "model.attention_backend=sdpa", "optimizer.lr=0.003", "optimizer.lr_warmup_iters=2"]
