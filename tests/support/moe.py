"""The MoE training settings the distributed MoE tests share (test_model_moe.py,
test_checkpoint_moe.py): fp32, dropless, no dropout, clipping on, 10 steps of 8 samples."""

MOE = ["model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.aux_loss_coeff=0.01",
       "model.moe.z_loss_coeff=0.001", "model.moe.layer_freq=2",
       "training.precision=fp32", "training.train_iters=10", "training.global_batch_size=8",
       "training.micro_batch_size=2", "training.tensorboard=false", "training.clip_grad=0.5",
       "model.hidden_dropout=0.0", "model.attention_dropout=0.0", "resilience.check_node=false",
       "model.attention_backend=sdpa", "optimizer.lr=0.003", "optimizer.lr_warmup_iters=2"]


def trained_moe(built, steps=3):
    """(model, MergedCheckpoint) of a MoE model -> the same after a few Adam steps on random
    tokens, the merged state dict taken afterwards (the router away from its start, so the
    routing is a trained model's, not near-uniform). The model is in eval mode (no dropout)."""
    import torch
    from megatron.checkpoint.convert import MergedCheckpoint
    model, merged = built
    vocab, padded = merged.vocab_size, merged.padded_vocab_size
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (2, 33), generator=g)
        logits = model(tokens[:, :-1])  # [s, b, V]
        loss = torch.nn.functional.cross_entropy(logits.transpose(0, 1).reshape(-1, padded),
                                                 tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return model, MergedCheckpoint(merged.config, sd, vocab, padded, {})
