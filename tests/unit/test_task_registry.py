"""The task registry: one `TaskSpec` per task, found by name; what goes through it checks the task once."""

import pytest

import attn
from attn.app.runs import run_config
from attn.app.tasks import TASKS, EvalOptions, evaluate, get_task, task_names
from attn.artifacts import Bundle
from attn.core.config import Architecture
from attn.data.tokenizers import Tokenizer
from attn.core.errors import AttnError, ConfigError
from attn.models import build_model
from attn.core.presets import preset
from attn.training.runconfig import RunConfig
from attn.training.task_data import TaskContext


def test_every_task_has_one_entry_under_its_own_name():
    assert task_names() == ["translation", "lm", "classification", "mlm", "embedding"]
    assert task_names(trainable=True) == ["translation", "lm", "classification", "mlm"]
    assert all(spec.name == name for name, spec in TASKS.items())
    architectures = {name: spec.architecture for name, spec in TASKS.items()}
    assert architectures == {"translation": Architecture.ENCODER_DECODER, "lm": Architecture.DECODER_ONLY,
                             "classification": Architecture.ENCODER_ONLY, "mlm": Architecture.ENCODER_ONLY,
                             "embedding": None}
    assert {name for name, spec in TASKS.items() if spec.evaluator} == {"translation", "lm", "classification"}
    assert {name for name, spec in TASKS.items() if spec.baseline} == {"translation", "lm", "classification"}
    assert get_task("classification").metric == "val_accuracy" and get_task("lm").metric == "val_loss"


def test_an_unknown_task_is_an_error_that_lists_the_valid_names():
    with pytest.raises(ConfigError, match="^task: unknown task 'summarise'; choose one of 'translation', 'lm', "
                                          "'classification', 'mlm', 'embedding'$"):
        get_task("summarise")
    with pytest.raises(ConfigError, match="^task: unknown task 'summarise'; choose one of 'translation', 'lm', "
                                          "'classification', 'mlm'$"):
        run_config({"task": "summarise"})
    with pytest.raises(ConfigError, match="^task: attn does not train 'embedding' models"):
        attn.train(RunConfig().override("task=embedding"))
    with pytest.raises(ConfigError, match="^--task: unknown task 3"):
        get_task(3, field="--task")


def test_a_task_trains_only_its_architecture():
    with pytest.raises(ConfigError, match="task 'lm' trains decoder-only models, but preset 'paper-base' is "
                                          "encoder-decoder"):
        get_task("lm").build(RunConfig(task="lm"), preset("paper-base-tiny"), TaskContext())


def test_a_task_without_evaluation_says_which_tasks_have_one():
    tokenizer = Tokenizer.train_chars(["a b c"])
    config = preset("bert-base-tiny").replace(vocab_size=tokenizer.vocab_size)
    bundle = Bundle(model=build_model(config).eval(), tokenizer=tokenizer, task="mlm", model_config=config, path=".",
                    pad_id=tokenizer.pad_id)
    with pytest.raises(AttnError, match="no evaluation for task 'mlm'; evaluate translation, lm or classification"):
        evaluate(bundle, "unused.txt", EvalOptions())


def test_the_inference_calls_give_json_ready_records():
    tokenizer = Tokenizer.train_chars(["in the beginning", "en el principio"])
    config = preset("paper-base-tiny").replace(vocab_size=tokenizer.vocab_size, max_positions=24)
    translator = Bundle(model=build_model(config).eval(), tokenizer=tokenizer, task="translation", model_config=config,
                        path=".", start_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
    (record,) = get_task("translation").infer(translator, ["in the"])
    assert set(record) == {"translation"} and isinstance(record["translation"], str)
    encoder = preset("bert-base-tiny").replace(vocab_size=tokenizer.vocab_size)
    embedder = Bundle(model=build_model(encoder).eval(), tokenizer=tokenizer, task="embedding", model_config=encoder,
                      path=".", pad_id=tokenizer.pad_id)
    records = get_task("embedding").infer(embedder, ["in the", "en el"])
    assert [len(r["embedding"]) for r in records] == [encoder.d_model] * 2
    assert sum(x * x for x in records[0]["embedding"]) == pytest.approx(1.0, abs=1e-5)  # L2-normalised
    assert get_task("mlm").infer is None
