"""ef.models: the converted models against PyTorch's logits (tests/models/reference/, made by
make_reference.py where torch is), the key maps of every layout, the loader's errors, and
fine-tuning's frozen parameters."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from safetensors.numpy import save_file

import easyfit as ef
from easyfit.persistence.export import load_exported
from tests.models.reference import draw


def _save(arrays: dict[str, np.ndarray], path) -> str:
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path))
    return str(path)


def _logits(model: nnx.Module, name: str) -> np.ndarray:
    x = jnp.asarray(draw.images(name).transpose(0, 2, 3, 1))  # NCHW -> NHWC
    model.eval()
    return np.asarray(jax.jit(lambda m, x: m(x))(model, x))


def _parity(model: nnx.Module, name: str, tmp_path, layout: str) -> None:
    ef.models.load_weights(model, _save(draw.weights(name), tmp_path / f"{name}.safetensors"), layout)
    ref = draw.HERE / f"{name}.npz"
    if not ref.exists():  # the mapping is checked above; the logits come with the .npz
        pytest.fail(f"{ref} is missing: run tests/models/reference/make_reference.py where torch is")
    want = np.load(ref)["logits"]
    got = _logits(model, name)
    # 1e-5 of the largest logit: float32 sums in another order, elementwise
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def _zeros(make) -> nnx.Module:
    """``make()``'s module with zeros for its variables: built from its shapes, without drawing
    millions of initial weights op by op (most of a full-size model's time on a CPU) that the
    loaded weights replace; load_weights refuses a file that leaves any parameter or statistic
    unset."""
    graphdef, state = nnx.split(nnx.eval_shape(make))
    return nnx.merge(graphdef, jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), state))


@pytest.mark.slow  # the full-size models: tens of seconds on a shared CPU
def test_resnet18_matches_torchvision(tmp_path):
    _parity(_zeros(ef.models.resnet18), "torchvision_resnet18", tmp_path, "torchvision")


@pytest.mark.slow
def test_vit_small_matches_timm(tmp_path):
    _parity(_zeros(ef.models.vit_small_patch16_224), "timm_vit_small_patch16_224", tmp_path, "timm")


@pytest.mark.slow
def test_resnet50_matches_torchvision(tmp_path):
    _parity(_zeros(ef.models.resnet50), "torchvision_resnet50", tmp_path, "torchvision")


def _tiny_vit(**kw) -> ef.models.ViT:
    return ef.models.ViT(dim=16, depth=2, heads=2, num_classes=5, image_size=32, **kw)


def _timm_names(model: nnx.Module) -> dict[str, np.ndarray]:
    """The model's own weights as timm would save them (names and PyTorch's layouts)."""
    out = {}
    for key, var in nnx.to_flat_state(nnx.state(model, nnx.Any(nnx.Param, nnx.BatchStat))):
        path = ".".join(str(k) for k in key)
        a = np.asarray(var[...])
        if path.endswith(".kernel"):
            path, a = path[: -len("kernel")] + "weight", (a.transpose(3, 2, 0, 1) if a.ndim == 4 else a.T)
        elif path.endswith(".scale"):
            path = path[: -len("scale")] + "weight"
        path = path.replace(".mean", ".running_mean").replace(".var", ".running_var")
        out[path] = a
    return out


def test_hf_vit_layout_loads_as_timm_and_errors_name_both_keys(tmp_path):
    """Hugging Face's ViT names (query, key and value apart; its LayerNorm epsilon, from
    config.json, checked) give the model timm's names give;
    a file with a missing, an extra and a mis-shaped key is refused in one error naming each
    in the file and the model, and the model is left as it was."""
    source = _tiny_vit(rngs=nnx.Rngs(1), norm_eps=1e-12)
    timm = _timm_names(source)
    hf = {}
    for k, v in timm.items():
        hf_key = (
            k.replace("cls_token", "vit.embeddings.cls_token")
            .replace("pos_embed", "vit.embeddings.position_embeddings")
            .replace("patch_embed.proj", "vit.embeddings.patch_embeddings.projection")
            .replace("blocks.", "vit.encoder.layer.")
            .replace("norm1", "layernorm_before")
            .replace("norm2", "layernorm_after")
            .replace("attn.proj", "attention.output.dense")
            .replace("mlp.fc1", "intermediate.dense")
            .replace("mlp.fc2", "output.dense")
            .replace("head.", "classifier.")
        )
        hf_key = "vit.layernorm." + k.split(".")[-1] if k.startswith("norm.") else hf_key
        if ".attn.qkv." in k:
            for part, name in zip(np.split(v, 3, axis=0), ("query", "key", "value"), strict=True):
                hf[hf_key.replace("attn.qkv", f"attention.attention.{name}")] = part
        else:
            hf[hf_key] = v
    x = jnp.asarray(np.random.default_rng(0).random((2, 32, 32, 3)), jnp.float32)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"layer_norm_eps": 1e-12}))
    _save(hf, tmp_path / "hf" / "model.safetensors")
    with pytest.raises(ValueError, match="layer_norm_eps is 1e-12, the model's 1e-06"):
        ef.models.load_weights(_tiny_vit(), tmp_path / "hf", "hf")
    model = ef.models.load_weights(_tiny_vit(norm_eps=1e-12), tmp_path / "hf", "hf")
    forward = jax.jit(lambda m, x: m(x))
    np.testing.assert_allclose(forward(model, x), forward(source, x), rtol=1e-6, atol=1e-6)

    bad = dict(timm)
    del bad["blocks.1.mlp.fc2.bias"]
    bad["blocks.0.attn.extra.weight"] = np.zeros((3, 3), np.float32)
    bad["blocks.0.mlp.fc1.weight"] = np.zeros((8, 16), np.float32)
    before = np.asarray(model.blocks[0].mlp.fc1.kernel[...])
    with pytest.raises(ValueError) as e:
        ef.models.load_weights(model, _save(bad, tmp_path / "bad.safetensors"), "timm")
    message = str(e.value)
    assert "bad.safetensors" in message
    assert "1 missing" in message and "blocks/1/mlp/fc2/bias (as blocks.1.mlp.fc2.bias)" in message
    assert "1 extra" in message and "blocks.0.attn.extra.weight" in message
    assert "blocks.0.mlp.fc1.weight (8, 16) -> blocks/0/mlp/fc1/kernel (16, 64)" in message
    np.testing.assert_array_equal(np.asarray(model.blocks[0].mlp.fc1.kernel[...]), before)


def test_new_head_from_a_hub_folder_with_its_recipe(tmp_path):
    """A hub cache folder (snapshots/<hash>/model.safetensors and timm's config.json): the
    backbone and BatchNorm statistics load, the 1000-class head is left for the model's 3
    classes, and the weights' preprocessing becomes ImageFolder's arguments; the model follows
    bfloat16 weights."""
    width = dict(width=4, in_channels=1)
    source = ef.models.ResNet([1, 1], bottleneck=True, num_classes=1000, rngs=nnx.Rngs(1), **width)
    source.bn1.mean[...] = jnp.arange(4.0)
    snap = tmp_path / "models--timm--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    _save(_timm_names(source), snap / "model.safetensors")
    cfg = {
        "input_size": [1, 48, 40],
        "interpolation": "bicubic",
        "crop_pct": 0.95,
        "mean": [0.5],
        "std": [0.25],
    }
    (snap / "config.json").write_text(json.dumps({"architecture": "resnet", "pretrained_cfg": cfg}))
    model = ef.models.ResNet([1, 1], bottleneck=True, num_classes=3, **width)
    fresh_head = np.asarray(model.fc.kernel[...])
    ef.models.load_weights(model, tmp_path / "models--timm--tiny")
    np.testing.assert_array_equal(np.asarray(model.bn1.mean[...]), np.arange(4.0))
    np.testing.assert_array_equal(
        np.asarray(model.layer2[0].conv2.kernel[...]), np.asarray(source.layer2[0].conv2.kernel[...])
    )
    np.testing.assert_array_equal(np.asarray(model.fc.kernel[...]), fresh_head)
    assert model.preprocessing.image_folder_kwargs(eval_crop=None) == {
        "image_size": (48, 40),
        "normalize": ((0.5,), (0.25,)),
        "eval_crop": None,
        "color_mode": "grayscale",  # one channel's mean and std
        "interpolation": "bicubic",  # for ImageFolder: DALI's cubic filter
    }
    assert model.preprocessing.interpolation == "bicubic"
    # bfloat16 weights (the Trainer's precision) keep the passes in bfloat16 through BatchNorm
    graph, params, rest = nnx.split(model, nnx.Param, ...)
    half = nnx.merge(graph, jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), params), rest)
    half.eval()
    spec = jax.ShapeDtypeStruct((1, 48, 40, 1), jnp.bfloat16)
    assert jax.eval_shape(half.features, spec).dtype == jnp.bfloat16
    with pytest.raises(ValueError, match=r"fc.weight \(1000, 32\) -> fc/kernel \(32, 3\)"):
        ef.models.load_weights(model, tmp_path / "models--timm--tiny", strict_head=True)
    # the same folder as huggingface_hub's cache, named by its repository ("hf://"), offline
    hub = _hub_constants()
    (tmp_path / "models--timm--tiny" / "refs").mkdir()
    (tmp_path / "models--timm--tiny" / "refs" / "main").write_text("abc123")
    with pytest.MonkeyPatch.context() as env:
        env.setattr(hub, "HF_HUB_CACHE", str(tmp_path))
        env.setattr(hub, "HF_HUB_OFFLINE", True)
        again = ef.models.ResNet([1, 1], bottleneck=True, num_classes=3, **width)
        ef.models.load_weights(again, "hf://timm/tiny")
        np.testing.assert_array_equal(np.asarray(again.bn1.mean[...]), np.arange(4.0))
        assert again.preprocessing.interpolation == "bicubic"
        with pytest.raises(FileNotFoundError, match=r"weights 'hf://timm/absent': the hub gave no weights"):
            ef.models.load_weights(again, "hf://timm/absent")


def _hub_constants():
    import huggingface_hub.constants  # the hub extra; in the dev extra too

    return huggingface_hub.constants


def test_head_only_fit_freezes_the_backbone_and_its_batchnorm(tmp_path):
    """trainable='head' with per-group rates: the backbone's weights and BatchNorm statistics
    do not move in fit, only the head has optimizer state, the head trains."""
    model = ef.models.ResNet([1], bottleneck=False, num_classes=10, width=4, in_channels=1)
    before = nnx.state(model, nnx.Any(nnx.Param, nnx.BatchStat))
    before = jax.tree_util.tree_map(np.asarray, before)
    tx = ef.models.trainable(model, optax.sgd(0.1, momentum=0.9), "head", groups={"bias": optax.sgd(0.0)})
    train = ef.data.ImageFolder(ef.datasets.sample_folder(tmp_path / "mnist", limit=(24, 8)) + "/train")
    trainer = ef.Trainer(model, optimizer=tx, loss="sparse_categorical_crossentropy")
    trainer.fit(train, epochs=1, batch_size=8, verbose=0)
    after = nnx.state(model, nnx.Any(nnx.Param, nnx.BatchStat))
    for (key, old), (_, new) in zip(
        nnx.to_flat_state(before), nnx.to_flat_state(jax.tree_util.tree_map(np.asarray, after)), strict=True
    ):
        moved = not np.array_equal(np.asarray(old[...]), np.asarray(new[...]))
        assert moved == (key == ("fc", "kernel")), key  # the bias's group has a rate of 0
    # no LoRA layers: adapters alone cannot be saved, and a ModelCheckpoint of them stops fit at once
    check = ef.callbacks.ModelCheckpoint(str(tmp_path / "a"), adapters_only=True)
    check.set_trainer(trainer)
    with pytest.raises(ValueError, match=r"adapters_only=True\): the model has no LoRA adapters"):
        check.on_train_begin()
    with pytest.raises(ValueError, match="ResNet has no LoRA layer"):
        trainer.save(tmp_path / "b", adapters_only=True)
    assert not (tmp_path / "b").exists()
    with pytest.raises(ValueError, match="not both"):
        ef.callbacks.ModelCheckpoint("c", save_weights_only=True, adapters_only=True)
    momenta = [a for a in jax.tree_util.tree_leaves(trainer.state.opt_state) if np.ndim(a) > 0]
    assert sorted(a.shape for a in momenta) == [(4, 10)], [a.shape for a in momenta]
    # an unfreeze schedule: the first block's second convolution trains from step 2
    tx = ef.models.trainable(model, optax.sgd(0.1), "head", unfreeze={"^layer1/0/conv2/": 2})
    params = nnx.state(model, nnx.Param)
    opt_state = tx.init(params)
    moved = []
    for _ in range(3):
        grads = jax.tree_util.tree_map(jnp.ones_like, params)
        updates, opt_state = tx.update(grads, opt_state, params)
        new = optax.apply_updates(params, updates)
        changed = lambda a, b: not np.array_equal(np.asarray(a), np.asarray(b))  # noqa: E731
        moved.append(
            (
                changed(new["layer1"][0]["conv2"]["kernel"], params["layer1"][0]["conv2"]["kernel"]),
                changed(new["layer1"][0]["conv1"]["kernel"], params["layer1"][0]["conv1"]["kernel"]),
            )
        )
        params = new
    assert moved == [(False, False), (False, False), (True, False)]
    with pytest.raises(ValueError, match="match no parameter path"):
        ef.models.trainable(model, optax.sgd(0.1), ["^nothing/"])


LORA = ("attn/qkv", "attn/proj", "mlp/fc1", "mlp/fc2")


def test_lora_trains_adapters_and_head_only_and_merges_back():
    """trainable='lora:rank=2' puts adapters on a ViT's attention and MLP kernels without
    changing its outputs; an update moves only the adapters and the head; merge_lora folds
    them into plain Linear layers that give the same outputs."""
    model = _tiny_vit(rngs=nnx.Rngs(1))
    x = jnp.asarray(np.random.default_rng(0).random((2, 32, 32, 3)), jnp.float32)
    forward = jax.jit(lambda m, x: m(x))
    before = np.asarray(forward(model, x))
    tx = ef.models.trainable(model, optax.sgd(0.1), "lora:rank=2")
    assert isinstance(model.blocks[1].attn.qkv, nnx.LoRALinear)
    np.testing.assert_allclose(forward(model, x), before, rtol=1e-6, atol=1e-6)  # lora_b is zero
    params = nnx.state(model, nnx.Param)
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    moved = {
        ef.models.finetune.parameter_path(k)
        for k, u in jax.tree_util.tree_flatten_with_path(updates)[0]
        if np.any(np.asarray(u) != 0)
    }
    adapters = {f"blocks/{i}/{m}/lora/lora_{ab}" for i in (0, 1) for m in LORA for ab in "ab"}
    assert moved == adapters | {"head/kernel", "head/bias"}, sorted(moved ^ adapters)
    nnx.update(model, optax.apply_updates(params, updates))
    tuned = np.asarray(forward(model, x))
    ef.models.merge_lora(model)
    assert type(model.blocks[1].attn.qkv) is nnx.Linear
    np.testing.assert_allclose(forward(model, x), tuned, rtol=1e-5, atol=1e-5)


def test_lora_adapters_saved_alone_loaded_onto_the_base_and_merged_on_export(tmp_path):
    """Two steps of LoRA fine-tuning of a tiny ViT loaded from timm-style files whose config
    names a recipe: fit(folder) reads the folder with it (input size, mean, std, crop), and it
    travels in the checkpoint, the export and the adapters; trainer.save(adapters_only=True)
    writes the adapters and the head alone, which on a fresh model of the same base give the
    trained outputs; another base or rank is refused naming what differs; the export holds
    merged plain weights (no adapter arrays) and gives the unmerged model's outputs.
    ModelCheckpoint(adapters_only=True) writes adapters folders (max_to_keep deletes the older),
    which trainer.load puts onto a LoRA model of the same base (the trained predictions, the
    epoch, the optimizer state; another optimizer's is said and left), and refuses, naming
    the folder, for a model without LoRA or of another base. The weights' bicubic
    interpolation is in every recipe."""
    base = _tiny_vit(rngs=nnx.Rngs(1), in_channels=1)
    (tmp_path / "w").mkdir()
    _save(_timm_names(base), tmp_path / "w" / "model.safetensors")
    cfg = {
        "input_size": [1, 32, 32],
        "interpolation": "bicubic",
        "crop_pct": 1.0,
        "mean": [0.5],
        "std": [0.25],
    }
    (tmp_path / "w" / "config.json").write_text(json.dumps({"pretrained_cfg": cfg}))

    def fresh() -> ef.models.ViT:
        model = ef.models.ViT(16, 2, 2, num_classes=10, image_size=32, in_channels=1, rngs=nnx.Rngs(7))
        return ef.models.load_weights(model, tmp_path / "w")  # a new head for the 10 digits

    def lora_trainer(model: ef.models.ViT) -> ef.Trainer:
        tx = ef.models.trainable(model, optax.adam(1e-2), "lora:rank=2")
        return ef.Trainer(model, optimizer=tx, loss="sparse_categorical_crossentropy")

    model = fresh()
    root = ef.datasets.sample_folder(tmp_path / "mnist", limit=(8, 2))
    trainer = lora_trainer(model)
    ckpt = ef.callbacks.ModelCheckpoint(str(tmp_path / "ck-{epoch}"), adapters_only=True, max_to_keep=1)
    trainer.fit(root + "/train", epochs=2, batch_size=8, verbose=0, callbacks=[ckpt])  # the weights' recipe
    assert np.any(np.asarray(model.blocks[0].attn.qkv.lora.lora_b[...]) != 0)  # the adapters trained
    full = ef.checkpoint.read_metadata(trainer.save(tmp_path / "full"))["recipe"]["images"]
    assert full["image_size"] == [32, 32] and (full["mean"], full["std"]) == ([0.5], [0.25]), full
    assert full["eval_crop"] == 1.0 and full["interpolation"] == "bicubic", full
    assert ckpt.saved == [str(tmp_path / "ck-1"), str(tmp_path / "ck-2")]
    assert not (tmp_path / "ck-1").exists()  # max_to_keep=1
    folder = ef.models.adapters
    assert sorted(os.listdir(tmp_path / "ck-2")) == sorted([folder.ADAPTERS, folder.CONFIG, folder.OPTIMIZER])
    restored = lora_trainer(fresh())
    meta = restored.load(tmp_path / "ck-2")
    assert (meta["kind"], meta["epoch"], meta["step"]) == ("adapters", 2, 2), meta
    assert int(restored.state.step) == 2  # and the optimizer state, the adapters' and head's moments
    moments = [jax.tree_util.tree_leaves(t.state.opt_state) for t in (restored, trainer)]
    assert sum(np.size(a) for a in moments[1]) < 3000  # none for the frozen base
    for got, want in zip(*moments, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert restored.class_names == trainer.class_names
    np.testing.assert_allclose(
        restored.predict(root + "/val"), trainer.predict(root + "/val"), rtol=0, atol=1e-5
    )
    other_tx = ef.Trainer(ef.models.add_lora(fresh(), 2), optimizer=optax.sgd(0.1))
    with pytest.warns(UserWarning, match=r"ck-2: the optimizer state saved with the adapters is another"):
        other_tx.load(tmp_path / "ck-2")  # the adapters load, the optimizer starts afresh
    with pytest.raises(ef.errors.CheckpointError, match=r"ck-2: holds LoRA adapters, but .* no LoRA layers"):
        ef.Trainer(fresh()).load(tmp_path / "ck-2")
    other_base = ef.models.ViT(16, 2, 2, num_classes=10, image_size=32, in_channels=1)
    tx = ef.models.trainable(other_base, optax.adam(1e-2), "lora:rank=2")
    with pytest.raises(ef.errors.CheckpointError, match=r"ck-2: adapters .* other base weights"):
        ef.Trainer.from_checkpoint(tmp_path / "ck-2", other_base, optimizer=tx)

    saved = trainer.save(tmp_path / "adapters", adapters_only=True)
    arrays = ef.models.adapters.ADAPTERS
    from safetensors.numpy import load_file

    keys = set(load_file(f"{saved}/{arrays}"))
    assert keys == {f"blocks/{i}/{m}/lora/lora_{ab}" for i in (0, 1) for m in LORA for ab in "ab"} | {
        "head/kernel",
        "head/bias",
    }
    x = jnp.asarray(np.random.default_rng(0).random((2, 32, 32, 1)), jnp.float32)
    forward = jax.jit(lambda m, x: m(x))
    model.eval()
    tuned = np.asarray(forward(model, x))
    again = fresh()
    del again.preprocessing
    config = ef.models.load_adapters(again, saved)
    again.eval()
    np.testing.assert_allclose(np.asarray(forward(again, x)), tuned, rtol=1e-6, atol=1e-6)
    assert again.preprocessing == model.preprocessing and config["recipe"]["images"] == full

    other = ef.models.ViT(16, 2, 2, num_classes=10, image_size=32, in_channels=1)  # another base
    with pytest.raises(
        ValueError,
        match=r"other base weights.*11 of 30 base parameters of other values \(blocks/0/attn/proj/kernel",
    ):
        ef.models.load_adapters(other, saved)
    ranked = ef.models.add_lora(fresh(), rank=3)
    with pytest.raises(ValueError, match=r"blocks/0/attn/proj: rank 2 in the adapters, 3 in the model"):
        ef.models.load_adapters(ranked, saved)
    assert np.all(np.asarray(ranked.blocks[0].attn.qkv.lora.lora_b[...]) == 0)  # left as it was

    fn, meta = load_exported(trainer.export(tmp_path / "exported", inputs="prepared"))
    np.testing.assert_allclose(
        np.asarray(fn(x.astype(jnp.float16))),
        np.asarray(forward(model, x.astype(jnp.float16).astype(jnp.float32))),
        rtol=1e-5,
        atol=1e-5,
    )
    assert meta["recipe"]["images"] == full
    text = jax.export.deserialize(
        bytearray((tmp_path / "exported" / "model.stablehlo").read_bytes())
    ).mlir_module()
    assert "16x2xf32" not in text and "2x48xf32" not in text  # no adapter arrays: merged
    assert isinstance(model.blocks[0].attn.qkv, nnx.LoRALinear)  # the trainer's model keeps them
