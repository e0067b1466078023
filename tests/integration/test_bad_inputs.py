"""The bad-input catalogue: broken input of every kind, given to the real `attn` command line.

Each case runs one `attn` command in a subprocess, in a folder of its own, and checks what the
user gets: exit status 2 for a usage or configuration mistake and 1 for any other failure; one
line `attn: error: ...` that names what was wrong and the fix (argparse keeps its own usage line
above its `error:` line); no traceback; and no file written by the failed command, temporary or
partial. Cases that need a checkpoint use three tiny runs trained once for the module (one step
each of a translator, a language model and a classifier).

`docs/bad-inputs.md` lists the same cases with the messages users see;
`test_docs_table_lists_exactly_the_cases` keeps the two in step. Running this file as a script
(`python tests/integration/test_bad_inputs.py`) runs every case and rewrites that table.

The HTTP server's bad requests (`attn serve`: malformed JSON, wrong types, empty inputs, prompts
beyond the positions, oversized bodies, unknown models, routes a model cannot serve, a full queue,
internal errors) are catalogued in `test_serve_bad_inputs.py`.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import tokenizers
import torch
from cli_helpers import ROOT, run_cli

from attn.app.cli import main
from attn.artifacts.checkpoint import load_checkpoint
from attn.artifacts.pretrained import SpecialIds, export_pretrained
from attn.data.tokenizers import Tokenizer
from attn.decoding import GenerationConfig, generate, generate_seq2seq
from attn.core.errors import GenerationError
from attn.models import build_model
from attn.core.presets import preset

DOCS = ROOT / "docs" / "bad-inputs.md"
TASKS = ("translation", "lm", "classifier")
TINY_CONFIGS = {
    "translation": 'task = "translation"\n[data]\ntrain = "{data}/pairs.tsv"\n[tokenizer]\nkind = "chars"\n'
                   '[model]\npreset = "paper-base-tiny"\n[batch]\nmax_tokens = 512\n',
    "lm": 'task = "lm"\n[data]\ntrain = "{data}/text.txt"\n[tokenizer]\nkind = "chars"\n'
          '[model]\npreset = "char-gpt-tiny"\n[batch]\nbatch_size = 2\nblock_size = 16\n[optim]\nwarmup_steps = 0\n',
    "classifier": 'task = "classification"\n[data]\ntrain = "{data}/labels.tsv"\n[tokenizer]\nkind = "chars"\n'
                  '[model]\npreset = "bert-base-tiny"\n[batch]\nbatch_size = 4\n[optim]\nwarmup_steps = 0\n',
}
ONE_STEP = '[train]\nmax_steps = 1\neval_interval = 0\ncheckpoint_interval = 0\nquiet = true\ndevice = "cpu"\n'
PAIRS = "ref\ten\tes\nGen 1:1\tIn the beginning.\tEn el principio.\nGen 1:3\tLet there be light.\tSea la luz.\n"
LABELS = "label\ttext\nart\tA yawn is a silent shout.\nlaw\tThe court adjourned.\nfood\tEat your greens.\n"
LONG_TEXT = "x" * 100  # more characters, so more tokens, than the tiny models' 64 positions
STEP = "checkpoints/step-00000001"
CHAT = '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}\n'


# -- the world every case runs in -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class World:
    """Tiny configs, their data and one-step runs, under `root`: `tiny/` and `runs/<task>`."""

    root: Path

    def names(self, case_dir: Path) -> dict[str, str]:
        """What the `{...}` fields of a case's arguments stand for."""
        return {"case": str(case_dir), "tiny": str(self.root / "tiny"),
                **{task: str(self.root / "runs" / task) for task in TASKS}}

    def shown(self, text: str, case_dir: Path) -> str:
        """`text` with this world's temporary paths cut, as in the docs table."""
        return text.replace(f"{case_dir}/", "").replace(str(case_dir), ".").replace(f"{self.root}/", "")


def make_world(root: Path) -> World:
    """Writes the tiny data and configs and trains each tiny run for one step (in this process)."""
    tiny = root / "tiny"
    tiny.mkdir(parents=True)
    (tiny / "pairs.tsv").write_text(PAIRS * 4, encoding="utf-8")
    (tiny / "labels.tsv").write_text(LABELS + "".join(LABELS.splitlines(keepends=True)[1:]) * 3, encoding="utf-8")
    (tiny / "text.txt").write_text((ROOT / "data/shakespeare/valid.txt").read_text(encoding="utf-8")[:3000])
    for task, config in TINY_CONFIGS.items():
        (tiny / f"{task}.toml").write_text(config.format(data=tiny) + ONE_STEP, encoding="utf-8")
        assert main(["train", "--config", str(tiny / f"{task}.toml"), f"run_dir={root / 'runs' / task}"]) == 0
    return World(root)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return make_world(tmp_path_factory.mktemp("bad-inputs"))


# -- what a case prepares ---------------------------------------------------------------------

Prepare = Callable[[Path, Mapping[str, str]], None]  # (case folder, names) -> files written there


def files(contents: Mapping[str, bytes | str] | None = None) -> Prepare:
    """Writes each file (relative path: contents) into the case folder."""

    def prepare(folder: Path, names: Mapping[str, str]) -> None:
        for name, data in (contents or {}).items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)

    return prepare


def copy(source: str, name: str, change: Callable[[Path], None] = lambda path: None) -> Prepare:
    """Copies a run or checkpoint (`{translation}/...`) into the case folder as `name`, then breaks it."""

    def prepare(folder: Path, names: Mapping[str, str]) -> None:
        shutil.copytree(source.format(**names), folder / name)
        change(folder / name)

    return prepare


def truncate(name: str, keep: int) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_bytes((folder / name).read_bytes()[:keep])


def delete(name: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).unlink()


def overwrite(name: str, data: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_text(data, encoding="utf-8")


def edit_json(name: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        data = json.loads((folder / name).read_text(encoding="utf-8"))
        change(data)
        (folder / name).write_text(json.dumps(data), encoding="utf-8")

    return apply


def big_tokenizer(folder: Path) -> None:
    """Puts a tokenizer with more ids than the model's embeddings into a checkpoint."""
    Tokenizer.train_chars(["".join(map(chr, range(0x100, 0x200)))]).save(folder)


def export_gpt2(change: Callable[[Path], None]) -> Prepare:
    """Exports the tiny LM as a Hugging Face GPT-2 folder `hf` in the case folder, then breaks it."""

    def prepare(folder: Path, names: Mapping[str, str]) -> None:
        assert main(["convert", "--to", "gpt2", names["lm"], str(folder / "hf")]) == 0
        change(folder / "hf")

    return prepare


def marian_directory(change: Callable[[Path], None]) -> Prepare:
    """A tiny Hugging Face Marian folder `marian` (random weights; source.spm and target.spm trained
    on the tiny pairs, vocab.json from their pieces) in the case folder, then broken by `change`."""

    def prepare(folder: Path, names: Mapping[str, str]) -> None:
        import sentencepiece

        proto = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(PAIRS.splitlines()), model_writer=proto,
                                                 vocab_size=30, hard_vocab_limit=False, minloglevel=2)
        processor = sentencepiece.SentencePieceProcessor(model_proto=proto.getvalue())
        pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
                  if not (processor.is_control(i) or processor.is_unknown(i))]
        vocab = {piece: i for i, piece in enumerate(["</s>", "<unk>", *pieces, "<pad>"])}
        hf = folder / "marian"
        config = preset("marian-base-tiny").replace(vocab_size=len(vocab))
        pad = vocab["<pad>"]
        export_pretrained(build_model(config), config, hf, "marian", ids=SpecialIds(pad=pad, eos=0, decoder_start=pad))
        for name in ("source.spm", "target.spm"):
            (hf / name).write_bytes(proto.getvalue())
        (hf / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
        change(hf)

    return prepare


def tokenizer_json_without_specials(folder: Path, names: Mapping[str, str]) -> None:
    """A Hugging Face tokenizer.json (a word-level model of three words) that has no special token."""
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"in": 0, "the": 1, "beginning": 2}))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    backend.save(str(folder / "tokenizer.json"))


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


# -- the catalogue ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """One broken input.

    Attributes:
        id: the case's name (the docs table's key).
        input: what is wrong, in words.
        args: the arguments after `attn`; `{case}`, `{tiny}`, `{translation}`, `{lm}` and
            `{classifier}` name the case folder, the tiny configs and data, and the tiny runs.
        code: the exit status: 2 for usage and configuration errors, 1 for the others.
        expect: a part of the message that names the problem or the fix.
        prepare: writes the broken files into the case folder first.
    """

    id: str
    input: str
    args: tuple[str, ...]
    code: int
    expect: str
    prepare: Prepare = files()

    def argv(self, names: Mapping[str, str]) -> list[str]:
        return [arg.format(**names) for arg in self.args]


def train(task: str, *overrides: str) -> tuple[str, ...]:
    """`attn train` of a tiny one-step config into the case folder, with overrides."""
    return ("train", "--config", f"{{tiny}}/{task}.toml", "run_dir={case}/run", *overrides)


def translate(*args: str) -> tuple[str, ...]:
    return ("translate", "--model", "{translation}", *args)


def generate_from(*args: str) -> tuple[str, ...]:
    return ("generate", "--model", "{lm}", *args)


def translate_with(checkpoint: str) -> tuple[str, ...]:
    return ("translate", "--model", f"{{case}}/{checkpoint}", "In the beginning.", "-o", "{case}/out.txt")


def broken_translator(change: Callable[[Path], None]) -> Prepare:
    """The tiny translator's checkpoint, copied to `ckpt` in the case folder and broken by `change`."""
    return copy("{translation}/" + STEP, "ckpt", change)


TRAIN_PAIRS = "data.train={case}/pairs.tsv"


def train_tokenizer(*args: str) -> tuple[str, ...]:
    """`attn tokenizer train` into `tok` in the case folder."""
    return ("tokenizer", "train", "--output", "tok", *args)


CASES = [
    # usage: argparse answers before anything is loaded
    Case("unknown-command", "a command that does not exist", ("frobnicate",), 2, "invalid choice: 'frobnicate'"),
    Case("unknown-option", "an option the command does not have", translate("--colour", "red", "x"), 2,
         "unrecognized arguments: --colour"),
    Case("option-not-a-number", "a word where a number goes", translate("--beam-size", "four", "x"), 2,
         "invalid int value: 'four'"),
    Case("missing-model-option", "no --model", ("translate", "x"), 2, "the following arguments are required: --model"),
    Case("unknown-attention-kind", "--kind outside its choices", ("attention", "--model", "{translation}", "--kind",
         "diagonal", "x"), 2, "invalid choice: 'diagonal'"),
    # decoding settings: checked before the model is loaded
    Case("temperature-negative", "a temperature below 0", generate_from("--temperature", "-1", "ROMEO."), 2,
         "--temperature: must be a number >= 0, got -1.0; 0 decodes greedily"),
    Case("temperature-with-beam-search", "a temperature and a beam size", translate("--temperature", "0.5",
         "--beam-size", "4", "x"), 2, "--temperature: beam search does not sample"),
    Case("top-p-zero", "nucleus mass 0", generate_from("--top-p", "0", "ROMEO."), 2,
         "--top-p: must be in (0, 1], got 0.0"),
    Case("top-p-above-one", "nucleus mass 1.5", generate_from("--top-p", "1.5", "ROMEO."), 2,
         "--top-p: must be in (0, 1], got 1.5"),
    Case("min-p-above-one", "a min-p above 1", generate_from("--temperature", "1", "--min-p", "1.5", "ROMEO."), 2,
         "--min-p: must be in [0, 1], got 1.5"),
    Case("presence-penalty-beyond-two", "a presence penalty outside OpenAI's -2..2",
         generate_from("--presence-penalty", "2.5", "ROMEO."), 2, "--presence-penalty: must be in [-2, 2], got 2.5"),
    Case("logit-bias-not-a-pair", "a logit bias without its id", generate_from("--logit-bias", "5", "ROMEO."), 2,
         "argument --logit-bias: '5' is not ID=BIAS"),
    Case("logit-bias-beyond-100", "a logit bias outside OpenAI's -100..100",
         generate_from("--logit-bias", "5=101", "ROMEO."), 2,
         "--logit-bias: the bias of token 5 must be a number in [-100, 100], got 101.0"),
    Case("logit-bias-outside-vocabulary", "a biased token id the model does not have",
         generate_from("--logit-bias", "100000=5", "ROMEO."), 2, "--logit-bias: token id 100000 is outside the "
         "model's vocabulary"),
    Case("chat-logit-bias-outside-vocabulary", "a biased token id the model does not have, in a chat",
         ("chat", "--model", "{lm}", "--logit-bias", "100000=-100"), 2, "--logit-bias: token id 100000 is outside"),
    Case("beam-size-zero", "beam size 0", translate("--beam-size", "0", "x"), 2, "--beam-size: must be >= 1, got 0"),
    Case("max-new-tokens-zero", "no new tokens allowed", generate_from("--max-new-tokens", "0", "ROMEO."), 2,
         "--max-new-tokens: must be >= 1, got 0"),
    Case("samples-zero", "zero continuations per prompt", generate_from("--n", "0", "ROMEO."), 2,
         "--n: must be >= 1, got 0"),
    Case("samples-without-sampling", "several continuations of a greedy decode", generate_from("--n", "3", "ROMEO."),
         2, "--n: greedy decoding and beam search give one continuation per prompt; sample to draw 3"),
    Case("samples-with-beam-search", "samples of a beam search", generate_from("--beam-size", "4", "--n", "2",
         "ROMEO."), 2, "--n: greedy decoding and beam search give one continuation per prompt"),
    Case("n-best-above-beam-size", "more hypotheses than beams", generate_from("--beam-size", "2", "--n-best", "3",
         "ROMEO."), 2, "--n-best: must be in [1, beam_size=2], got 3"),
    Case("stop-with-beam-search", "a stop string for beam search", generate_from("--beam-size", "2", "--stop", ".",
         "ROMEO."), 2, "--stop: beam search stops at EOS only"),
    Case("stop-string-empty", "an empty stop string", generate_from("--stop", "", "ROMEO."), 2,
         "--stop: stop strings must not be empty"),
    # chat
    Case("chat-without-template", "`attn chat` with a model that has no chat template", ("chat", "--model", "{lm}"),
         1, "the model has no chat template, so it cannot chat; put the template it was trained with in "),
    Case("generate-chat-without-template", "`attn generate --chat` with a model that has no chat template",
         generate_from("--chat", "ROMEO."), 1, "the model has no chat template, so it cannot chat"),
    Case("system-without-chat", "a system message for plain generation",
         generate_from("--system", "Be brief.", "ROMEO."), 2,
         "--system: is the system message of a chat: give --chat as well"),
    Case("chat-top-p-above-one", "a nucleus mass above 1 in a chat", ("chat", "--model", "{lm}", "--top-p", "1.5"), 2,
         "--top-p: must be in (0, 1], got 1.5"),
    Case("chat-with-a-classifier", "`attn chat` with an encoder-only model", ("chat", "--model", "{classifier}"), 1,
         "chat needs a decoder-only model"),
    Case("chat-template-broken", "a chat template that does not compile", ("chat", "--model", "{case}/ckpt"), 1,
         "chat_template.jinja: the chat template does not compile: unexpected '}' (line 1 of the template)",
         copy("{lm}/" + STEP, "ckpt", lambda ckpt: (ckpt / "chat_template.jinja").write_text(
             "{{ messages[0].content }", encoding="utf-8"))),
    Case("unknown-device", "a device torch does not know", translate("--device", "gpu0", "x"), 2,
         "--device: unknown device 'gpu0'; use auto, cpu, cuda or cuda:N"),
    # data files
    Case("tsv-wrong-header", "a translation TSV without the source field `en`", train("translation", TRAIN_PAIRS), 1,
         "pairs.tsv:1: no field 'en' (source_field); the fields here are: src, tgt; set source_field to one of them",
         files({"pairs.tsv": "src\ttgt\nIn the beginning.\tEn el principio.\n"})),
    Case("tsv-wrong-column-count", "a row with a missing field", train("translation", TRAIN_PAIRS), 1,
         "pairs.tsv:3: expected 3 tab-separated fields (ref, en, es), got 2",
         files({"pairs.tsv": "ref\ten\tes\nGen 1:1\tIn the beginning.\tEn el principio.\nGen 1:2\tLight.\n"})),
    Case("tsv-stray-tab", "a tab inside a text", train("translation", TRAIN_PAIRS), 1,
         "pairs.tsv:2: expected 3 tab-separated fields (ref, en, es), got 4; a text must not contain a tab",
         files({"pairs.tsv": "ref\ten\tes\nGen 1:1\tIn the\tbeginning.\tEn el principio.\n"})),
    Case("tsv-empty-file", "an empty data file", train("translation", TRAIN_PAIRS), 1,
         "pairs.tsv:1: the file is empty; it must start with the header", files({"pairs.tsv": ""})),
    Case("tsv-invalid-utf8", "Latin-1 bytes in a UTF-8 file", train("translation", TRAIN_PAIRS), 1,
         "pairs.tsv:2: invalid UTF-8 (byte 0xe9); re-save the file as UTF-8",
         files({"pairs.tsv": b"ref\ten\tes\nGen 1:1\tIn the beginning.\tcaf\xe9\n"})),
    Case("tsv-binary", "a PNG image given as data", train("translation", TRAIN_PAIRS), 1,
         "contains a NUL byte, so it is binary", files({"pairs.tsv": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"})),
    Case("gzip-truncated", "a .gz file cut short", train("translation", "data.train={case}/pairs.tsv.gz"), 1,
         "is not a valid gzip file", files({"pairs.tsv.gz": gzipped(PAIRS.encode() * 40)[:60]})),
    Case("data-file-missing", "a data path that does not exist", train("translation", "data.train={case}/nowhere.tsv"),
         1, "nowhere.tsv: cannot be read (No such file or directory); check the path"),
    Case("data-path-is-a-directory", "a folder where a file goes", train("translation", "data.train={case}"), 1,
         "is a directory, not a data file or the path prefix of line-aligned files"),
    Case("csv-missing-field", "a CSV file without the target field asked for",
         train("translation", "data.train={case}/pairs.csv", "data.source_field=de", "data.target_field=en"), 1,
         "pairs.csv:1: no field 'en' (target_field); the fields here are: de, fr; set target_field to one of them",
         files({"pairs.csv": "de,fr\nIm Anfang.,Au commencement.\n"})),
    Case("csv-ragged-row", "a CSV row with a field too many (an unquoted comma)",
         train("translation", "data.train={case}/pairs.csv"), 1,
         "pairs.csv:3: expected 2 comma-separated fields (en, es), got 3; quote a field that holds a comma",
         files({"pairs.csv": "en,es\nIn the beginning.,En el principio.\nLight, at last.,Luz.\n"})),
    Case("csv-unclosed-quote", "a CSV field whose quote is never closed", train("translation", "data.train={case}/p.csv"),
         1, "p.csv:3: not valid CSV (unexpected end of data); quote fields that hold commas, quotes or line breaks",
         files({"p.csv": 'en,es\nIn the beginning.,En el principio.\n"Light.,Luz.\n'})),
    Case("csv-empty-value", "a CSV row whose source is empty", train("translation", "data.train={case}/pairs.csv"), 1,
         "pairs.csv:2: field 'en' (source_field) is empty; fill it in or delete the line",
         files({"pairs.csv": 'en,es\n"",En el principio.\n'})),
    Case("csv-no-rows", "a CSV file with a header and nothing else", train("translation", "data.train={case}/pairs.csv"),
         1, "pairs.csv: has no rows; add rows or use another file", files({"pairs.csv": "en,es\n"})),
    Case("jsonl-not-an-object", "a JSON Lines line that is a list", train("translation", "data.train={case}/p.jsonl"),
         1, "p.jsonl:2: the line is a JSON list, not an object; a JSON Lines file holds one object per line",
         files({"p.jsonl": '{"en": "In the beginning.", "es": "En el principio."}\n["Light.", "Luz."]\n'})),
    Case("jsonl-field-not-a-string", "a JSON Lines label that is a number",
         train("classifier", "data.train={case}/l.jsonl"), 1,
         "l.jsonl:1: field 'label' (label_field) is 1, a JSON int, not a string; write it in quotes",
         files({"l.jsonl": '{"text": "A yawn.", "label": 1}\n{"text": "The court.", "label": 2}\n'})),
    Case("jsonl-lone-surrogate", "a JSON Lines text with an unpaired surrogate escape",
         train("classifier", "data.train={case}/l.jsonl"), 1,
         "l.jsonl:2: field 'text' (text_field) is not valid Unicode: a lone surrogate U+D800 at character 2",
         files({"l.jsonl": '{"text": "A yawn.", "label": "a"}\n{"text": "A \\ud800", "label": "b"}\n'})),
    Case("text-files-different-lengths", "line-aligned `train.en` and `train.es` of different lengths",
         train("translation", "data.train={case}/train"), 1,
         "train.es: has 1 lines but train.en has 2; line-aligned files need one line per example in each",
         files({"train.en": "In the beginning.\nLight.\n", "train.es": "En el principio.\n"})),
    Case("text-file-missing", "a path prefix with the source file but not the target file",
         train("translation", "data.train={case}/train"), 1,
         "train.es: no such file (nor train.es.gz) for field 'es'; the fields (file suffixes) there are: en",
         files({"train.en": "In the beginning.\n"})),
    Case("join-key-unmatched", "a row whose key the join table lacks",
         train("translation", TRAIN_PAIRS, "data.source_field=en_kjv", "data.join={case}/kjv.tsv", "data.join_key=ref"),
         1, "pairs.tsv:3: ref='Gen 1:3' has no row in the join table kjv.tsv; add one there or drop this line",
         files({"pairs.tsv": PAIRS, "kjv.tsv": "ref\ten_kjv\nGen 1:1\tIn the beginning God created.\n"})),
    Case("lm-glob-matches-nothing", "a language model's corpus glob that matches no file",
         train("lm", "data.train={case}/texts/*.txt"), 2, "data.train: the pattern 'texts/*.txt' matches no file"),
    Case("lm-directory-without-files", "a language model's corpus folder with no files in it",
         train("lm", "data.train={case}/texts"), 2, "data.train: the directory 'texts' holds no file",
         files({"texts/.keep": ""})),
    Case("lm-corpus-empty", "a language model's corpus files that hold no text",
         train("lm", "data.train={case}/a.txt,{case}/b.txt.gz"), 1,
         "a.txt: the corpus (2 files: this one and 1 more) holds no text", files({"a.txt": "", "b.txt.gz": gzipped(b"")})),
    Case("chat-training-without-a-template", "conversations to train a model that has no chat template",
         train("lm", "data.train={case}/chats.jsonl", "data.format=chat"), 2,
         "data.format: chat needs the chat template and tokenizer of the model it fine-tunes",
         files({"chats.jsonl": CHAT})),
    Case("chat-format-for-translation", "conversations given to the translation task",
         train("translation", "data.train={case}/chats.jsonl", "data.format=chat"), 2,
         "format: chat files (conversations) train the lm task only", files({"chats.jsonl": CHAT})),
    Case("chat-no-assistant-turn", "a conversation without an assistant turn",
         ("evaluate", "--model", "{lm}", "{case}/chats.jsonl"), 1,
         "chats.jsonl:2: the conversation has no assistant turn",
         files({"chats.jsonl": CHAT + '{"messages": [{"role": "user", "content": "Hi"}]}\n'})),
    Case("file-list-for-one-file-task", "a list of files for a task that reads one",
         train("translation", 'data.train=["{case}/a.tsv", "{case}/b.tsv"]'), 2,
         "data.train: a list of files is read by the lm task only"),
    Case("token-cache-contradicts-tokenizer", "a run's token cache whose manifest names another id type",
         train("lm", "train.max_steps=2"), 1,
         "run/data/train.json: the cache has dtype 'uint16', but the tokenizer reading it needs 'uint8'",
         copy("{lm}", "run", edit_json("data/train.json", lambda data: data.update(dtype="uint16")))),
    Case("labels-single-class", "a classification file with one label", train("classifier", "data.train={case}/l.tsv"),
         1, "every row has the label 'art'; a classifier needs at least two classes",
         files({"l.tsv": "label\ttext\nart\tA yawn is a silent shout.\nart\tBrevity is the soul of wit.\n"})),
    Case("labels-unknown", "a test file with a label the classifier never saw",
         ("evaluate", "--model", "{classifier}", "{case}/test.tsv"), 1, "test.tsv:3: unknown label 'music'",
         files({"test.tsv": "label\ttext\nart\tA yawn.\nmusic\tLa la la.\n"})),
    # run configurations
    Case("config-file-missing", "--config names no file", ("train", "--config", "{case}/nowhere.toml"), 2,
         "config: cannot read nowhere.toml (No such file or directory)"),
    Case("toml-invalid-syntax", "a TOML file with a syntax error", ("train", "--config", "{case}/run.toml"), 2,
         "run.toml is not valid TOML", files({"run.toml": 'task = "lm"\n[data\ntrain = "x"\n'})),
    Case("toml-unknown-key", "a misspelt key in a TOML file", ("train", "--config", "{case}/run.toml"), 2,
         "optim.learning_rate: unknown key in OptimConfig; valid keys: optimizer, lr,",
         files({"run.toml": 'task = "lm"\n[optim]\nlearning_rate = 0.001\n'})),
    Case("toml-wrong-type", "a string where a number goes", ("train", "--config", "{case}/run.toml"), 2,
         "batch.batch_size: expected int, got str 'thirty-two'",
         files({"run.toml": 'task = "lm"\n[batch]\nbatch_size = "thirty-two"\n'})),
    Case("toml-without-data", "a config without its [data] section", ("train", "--config", "{case}/run.toml",
         "run_dir={case}/run"), 2, "data.train: is not set; give the path of the file",
         files({"run.toml": 'task = "lm"\n[model]\npreset = "char-gpt-tiny"\n' + ONE_STEP})),
    Case("data-format-unknown", "a data format attn does not read", train("translation", "data.format=xml"), 2,
         "data.format: unknown format 'xml'; choose one of auto, tsv, csv, jsonl, text"),
    Case("join-without-key", "a join table without the key to match on",
         train("translation", "data.join=data/bible-en-es/kjv.tsv.gz"), 2,
         "data.join_key: join and join_key go together: set both (the table and its key field) or neither"),
    Case("train-unknown-task", "`attn train` of a task that does not exist",
         ("train", "summarise", "--train", "{case}/texts.txt"), 2,
         "task: unknown task 'summarise'; choose one of 'translation', 'lm', 'classification', 'mlm'"),
    Case("train-task-without-data", "a task to train but no --train", ("train", "lm", "--run-dir", "{case}/run"), 2,
         "--train: is required to train a task: the training data"),
    Case("train-task-and-config", "a task and --config", ("train", "lm", "--config", "{tiny}/lm.toml"), 2,
         "--config: give a task ('lm') or --config, not both"),
    Case("train-nothing", "neither a task nor --config", ("train",), 2,
         "train: name a task (translation, lm, classification, mlm) and its --train data, or give --config"),
    Case("unknown-preset", "a preset name that does not exist", train("lm", "model.preset=paper-huge"), 2,
         "model.preset: unknown preset 'paper-huge'; valid presets: paper-base,"),
    Case("heads-not-dividing-d-model", "d_model=30 with 4 heads", train("lm", "model.d_model=30"), 2,
         "model.d_model: d_model=30 is not divisible by heads=4; pick heads among the divisors"),
    Case("rotary-odd-head-size", "rotary positions with a head size of 9", train("lm", "model.positional=rotary",
         "model.d_model=36"), 2, "rotary positions rotate pairs of features, but 9 features of each head rotate"),
    Case("task-needs-other-architecture", "a decoder-only preset for translation",
         train("translation", "model.preset=gpt2-tiny"), 2,
         "model: task 'translation' trains encoder-decoder models, but preset 'gpt2-tiny' is decoder-only"),
    Case("override-unknown-key", "an override of a field that does not exist", train("lm", "model.colour=red"), 2,
         "model.colour: unknown field; valid fields: architecture,"),
    Case("override-not-a-number", "a word for a number in an override", train("lm", "optim.lr=fast"), 2,
         "optim.lr: expected float, got str 'fast'"),
    Case("negative-learning-rate", "optim.lr below 0", train("lm", "optim.lr=-0.1"), 2,
         "optim.lr: must be >= 0.0, got -0.1"),
    Case("learning-rate-not-a-number", "optim.lr=nan", train("lm", "optim.lr=nan"), 2,
         "optim.lr: must be a finite number, got nan"),
    Case("batch-size-zero", "batch.batch_size 0", train("lm", "batch.batch_size=0"), 2,
         "batch.batch_size: must be >= 1, got 0"),
    Case("negative-max-minutes", "a negative time budget", train("lm", "train.max_minutes=-1"), 2,
         "train.max_minutes: must be >= 0.0, got -1.0"),
    Case("vocab-size-too-small", "a BPE vocabulary smaller than its special tokens",
         train("translation", "tokenizer.kind=bpe", "tokenizer.vocab_size=5"), 2,
         "tokenizer.vocab_size: is 5, but a bpe tokenizer needs at least 8"),
    Case("run-dir-is-a-file", "run_dir names an existing file", ("train", "--config", "{tiny}/lm.toml",
         "run_dir={case}/run"), 1, "is a file, not a directory; set run_dir to a new directory path",
         files({"run": "not a directory\n"})),
    Case("resume-with-other-model", "resuming a run with a different d_model", train("lm", "model.d_model=64"), 1,
         "its model differs from this run's in 'd_model'; use the same model settings to resume, or a new run_dir",
         copy("{lm}", "run")),
    Case("init-from-other-architecture", "fine-tuning a translator from a language model",
         train("translation", "model.init_from={lm}"), 2,
         "model: task 'translation' trains encoder-decoder models, but runs/lm is decoder-only"),
    # tokenizers
    Case("tokenizer-unknown-kind", "`attn tokenizer train --kind` outside its choices",
         train_tokenizer("--kind", "sentencepiece", "{tiny}/text.txt"), 2,
         "invalid choice: 'sentencepiece' (choose from 'bpe', 'byte-bpe', 'wordpiece', 'unigram', 'chars')"),
    Case("tokenizer-glob-matches-nothing", "a training-file pattern that matches no file",
         train_tokenizer("--kind", "bpe", "corpus/*.txt"), 2, "inputs: the pattern 'corpus/*.txt' matches no file"),
    Case("tokenizer-input-missing", "a training file that does not exist",
         train_tokenizer("--kind", "bpe", "nowhere.txt"), 2, "inputs: nowhere.txt: no such file or directory"),
    Case("tokenizer-input-invalid-utf8", "a Latin-1 training file", train_tokenizer("--kind", "bpe", "latin1.txt"), 1,
         "latin1.txt:2: invalid UTF-8 (byte 0xe9); re-save the file as UTF-8",
         files({"latin1.txt": b"In the beginning.\ncaf\xe9\n"})),
    Case("tokenizer-vocab-below-minimum", "a byte-level BPE vocabulary smaller than its 256 bytes",
         train_tokenizer("--kind", "byte-bpe", "--vocab-size", "100", "{tiny}/text.txt"), 2,
         "--vocab-size: is 100, must be at least 264"),
    Case("tokenizer-unigram-vocab-below-alphabet", "a unigram vocabulary too small for the characters of its texts",
         train_tokenizer("--kind", "unigram", "--vocab-size", "20", "{tiny}/text.txt"), 2,
         "a unigram vocabulary holds every one of the"),
    Case("tokenizer-output-not-empty", "an output directory that already holds a tokenizer",
         train_tokenizer("--kind", "chars", "{tiny}/text.txt"), 2,
         "--output: tok already holds a tokenizer; give a new directory, or replace it with --force",
         files({"tok/attn_tokenizer.json": '{"kind": "chars"}\n', "tok/tokenizer.json": "{}"})),
    Case("tokenizer-path-without-tokenizer", "tokenizer.path names a folder without a tokenizer",
         train("translation", "tokenizer.path={case}/tok"), 1,
         "tok: no tokenizer there; give a directory written by `attn tokenizer train`", files({"tok/notes.txt": ""})),
    Case("tokenizer-path-lacks-roles", "tokenizer.path names a tokenizer.json without a translator's special tokens",
         train("translation", "tokenizer.path={case}/tokenizer.json"), 2,
         "tokenizer.json has no pad, bos, eos token, which this task needs", tokenizer_json_without_specials),
    # checkpoints and model folders
    Case("model-path-missing", "--model names nothing", translate_with("nowhere"), 1,
         "nowhere: no such checkpoint or model directory; give an attn checkpoint, a run directory"),
    Case("safetensors-truncated", "a model.safetensors cut short",
         translate_with("ckpt"), 1, "model.safetensors: not a readable safetensors file",
         broken_translator(truncate("model.safetensors", 1000))),
    Case("checkpoint-missing-file", "a checkpoint without its weights file", translate_with("ckpt"), 1,
         "model.safetensors: no such file; the checkpoint is incomplete",
         broken_translator(delete("model.safetensors"))),
    Case("model-config-invalid-json", "a model_config.json that is not JSON", translate_with("ckpt"), 1,
         "model_config.json: not valid JSON", broken_translator(overwrite("model_config.json", '{"d_model": 32,'))),
    Case("weights-of-another-model", "weights from a differently sized model", translate_with("ckpt"), 1,
         "size mismatch for weight 'blocks.0.attn.out.bias': (32,) in the file, (64,) in the model described by "
         "model_config.json",
         broken_translator(edit_json("model_config.json", lambda config: config.update(d_model=64)))),
    Case("tokenizer-of-another-model", "a tokenizer with ids beyond the model's vocabulary (token ids outside it)",
         translate_with("ckpt"), 1, "some token ids would fall outside it", broken_translator(big_tokenizer)),
    Case("latest-pointer-dangling", "checkpoints/latest names a deleted checkpoint", translate_with("run"), 1,
         "checkpoints/latest names a checkpoint that no longer exists",
         copy("{translation}", "run", lambda run: shutil.rmtree(run / STEP))),
    Case("huggingface-unsupported-family", "a Hugging Face T5 folder", translate_with("t5"), 1,
         "model_type 't5' is not supported; attn converts gpt2, bert, marian",
         files({"t5/config.json": '{"model_type": "t5", "d_model": 512}'})),
    Case("huggingface-config-missing-fields", "a GPT-2 config.json without its sizes",
         ("generate", "--model", "{case}/hf", "ROMEO."), 1,
         "hf/config.json: describes a model of at least 102,363,904 numbers (vocab_size=50257, d_model=768",
         export_gpt2(overwrite("config.json", '{"model_type": "gpt2"}'))),
    Case("marian-spm-missing", "a Hugging Face Marian folder without its source.spm",
         translate_with("marian"), 1, "marian/source.spm: no such file; a Marian tokenizer needs source.spm, "
         "target.spm, vocab.json", marian_directory(delete("source.spm"))),
    Case("marian-spm-corrupt", "a Marian target.spm that is not a SentencePiece model",
         translate_with("marian"), 1, "marian/target.spm: not a SentencePiece model",
         marian_directory(overwrite("target.spm", "not a model"))),
    # inputs at inference
    Case("wrong-model-for-command", "translating with a classifier",
         ("translate", "--model", "{classifier}", "x"), 1, "translation needs an encoder-decoder model"),
    Case("embed-with-decoder-only", "sentence embeddings from a language model", ("embed", "--model", "{lm}", "x"), 1,
         "embedding needs an encoder-only model"),
    Case("input-longer-than-positions", "a sentence longer than the model's positions", translate(LONG_TEXT), 1,
         "a source of 100 tokens exceeds the model's max_positions=64; split or truncate long sentences"),
    Case("empty-input-text", "an empty sentence", translate(""), 1,
         "empty input text: give at least one non-blank line"),
    Case("text-argument-not-utf8", "a prompt argument with a Latin-1 byte", generate_from("caf\udce9"), 1,
         "text: is not valid Unicode: a lone surrogate U+DCE9 (the byte 0xe9 of text that is not UTF-8) at character 3"),
    Case("second-text-argument-not-utf8", "the second of two sentences with a byte that is not UTF-8",
         translate("ok", "\udcff"), 1, "text 2: is not valid Unicode: a lone surrogate U+DCFF (the byte 0xff"),
    Case("stop-argument-not-utf8", "a stop string with a Latin-1 byte", generate_from("--stop", "\udce9", "ROMEO."), 1,
         "--stop: is not valid Unicode: a lone surrogate U+DCE9 (the byte 0xe9"),
    Case("system-argument-not-utf8", "a system message with a Latin-1 byte",
         generate_from("--chat", "--system", "caf\udce9", "ROMEO."), 1, "--system: is not valid Unicode"),
    Case("embed-argument-not-utf8", "a text to embed with a Latin-1 byte",
         ("embed", "--model", "{classifier}", "caf\udce9"), 1, "text: is not valid Unicode"),
    Case("classify-input-file-not-utf8", "classify --input of a Latin-1 file",
         ("classify", "--model", "{classifier}", "--input", "{case}/in.txt"), 1,
         "in.txt:2: invalid UTF-8 (byte 0xe9); re-save the file as UTF-8", files({"in.txt": b"ok\ncaf\xe9\n"})),
    Case("attention-argument-not-utf8", "a sentence to draw with a Latin-1 byte",
         ("attention", "--model", "{lm}", "caf\udce9", "-o", "{case}/a.png"), 1, "text: is not valid Unicode"),
    Case("tokenizer-encode-argument-not-utf8", "a text to encode with a Latin-1 byte",
         ("tokenizer", "encode", "--tokenizer", "{lm}/" + STEP, "caf\udce9"), 1, "text: is not valid Unicode"),
    Case("prompts-file-missing", "--input names no file", generate_from("--input", "{case}/prompts.txt"), 1,
         "prompts.txt: cannot be read (No such file or directory); check the path"),
    Case("output-is-a-directory", "--output names a folder", translate("x", "-o", "{case}/out"), 1,
         "out: cannot write the output (Is a directory); give a file path", files({"out/keep": ""})),
    Case("embed-batch-size-zero", "embedding batches of 0 texts", ("embed", "--model", "{classifier}",
         "--batch-size", "0", "x"), 2, "batch_size: must be >= 1, got 0"),
    Case("evaluate-negative-limit", "--limit -1", ("evaluate", "--model", "{translation}", "{tiny}/pairs.tsv",
         "--limit", "-1"), 2, "limit: is -1, must be at least 1"),
    # tools
    Case("average-nothing", "`attn average` with no checkpoints", ("average", "--output", "{case}/avg"), 2,
         "no checkpoints given; name a run with --run RUN_DIR or list checkpoint directories"),
    Case("average-more-than-kept", "averaging more checkpoints than the run kept",
         ("average", "--run", "{translation}", "--last", "3", "--output", "{case}/avg"), 1,
         "asked to average the last 3 checkpoints, the run has 1"),
    Case("average-different-models", "averaging a translator with a language model",
         ("average", "{translation}/" + STEP, "{lm}/" + STEP, "--output", "{case}/avg"), 1,
         "model_config differs from runs/translation/checkpoints/step-00000001 in 'architecture'"),
    Case("plot-without-metrics", "`attn plot` on a folder that is not a run", ("plot", "{case}"), 1,
         "metrics.jsonl: no such file; plot a run directory that train() has written to"),
    Case("attention-head-out-of-range", "head 99 of a 4-head model",
         ("attention", "--model", "{translation}", "--head", "99", "x", "-o", "{case}/a.png"), 1,
         "head 99 does not exist: the model has heads 0..3"),
    Case("attention-kind-not-in-model", "cross-attention of a decoder-only model",
         ("attention", "--model", "{lm}", "--kind", "cross", "x", "-o", "{case}/a.png"), 1,
         "has no 'cross' attention; choose one of decoder"),
    Case("serve-host-not-local", "`attn serve` on an address that is not this machine's",
         ("serve", "--model", "{translation}", "--host", "192.0.2.1", "--insecure-no-key"), 2,
         "--host: cannot listen on 192.0.2.1:8000"),
    Case("serve-exposed-without-key", "`attn serve` on every interface without an API key",
         ("serve", "--model", "{translation}", "--host", "0.0.0.0"), 2,
         "--host: 0.0.0.0 lets other machines reach the server, which then needs an API key: give --api-key-file "
         "FILE (or set ATTN_API_KEY), or --insecure-no-key to serve without one"),
    Case("serve-key-file-empty", "an API key file with comments only",
         ("serve", "--model", "{translation}", "--api-key-file", "keys.txt"), 2,
         "--api-key-file: keys.txt holds no key; write one key per line", files({"keys.txt": "# keys\n\n"})),
    Case("serve-key-file-missing", "an API key file that does not exist",
         ("serve", "--model", "{translation}", "--api-key-file", "nowhere.txt"), 2,
         "--api-key-file: nowhere.txt: cannot be read (No such file or directory)"),
    Case("serve-key-with-space", "an API key file whose line holds a space",
         ("serve", "--model", "{translation}", "--api-key-file", "keys.txt"), 2,
         "--api-key-file: keys.txt:2: a key must be printable ASCII without spaces",
         files({"keys.txt": "# keys\nmy secret key\n"})),
    Case("serve-request-timeout-zero", "a request timeout of 0 s",
         ("serve", "--model", "{translation}", "--request-timeout", "0"), 2,
         "--request-timeout: must be a number of seconds > 0, got 0.0"),
    Case("serve-max-n-zero", "a cap of 0 choices per request", ("serve", "--model", "{translation}", "--max-n", "0"),
         2, "--max-n: must be >= 1, got 0"),
    Case("serve-cors-origin-not-an-origin", "a CORS origin without its scheme",
         ("serve", "--model", "{translation}", "--cors-origin", "example.com"), 2,
         "--cors-origin: 'example.com' is not an origin; give scheme://host[:port]"),
]


# -- running a case ---------------------------------------------------------------------------


def _listing(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


def run_case(case: Case, world: World) -> tuple[int, str, str]:
    """Prepares the case's folder and runs its command there; checks that nothing was left behind.

    Returns:
        (exit status, stdout, stderr).
    """
    folder = world.root / "cases" / case.id
    folder.mkdir(parents=True)
    names = world.names(folder)
    case.prepare(folder, names)
    before = _listing(folder)
    result = run_cli(*case.argv(names), cwd=folder, timeout=120)
    leftovers = [p for p in folder.rglob("*") if re.search(r"\.tmp|\.partial|^\.old-|^\.trash-", p.name)]
    assert not leftovers, f"temporary files left behind: {leftovers}"
    assert _listing(folder) == before, f"the failed command wrote {sorted(_listing(folder) - before)}"
    return result.returncode, result.stdout, result.stderr


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_gets_one_clear_line(case: Case, world: World) -> None:
    code, stdout, stderr = run_case(case, world)
    assert "Traceback" not in stdout + stderr, stderr
    assert code == case.code, stderr
    message = world.shown(stderr, world.root / "cases" / case.id)
    if stderr.startswith("usage:"):  # argparse's own format: a usage line, then `attn ...: error: ...`
        assert code == 2 and "error: " in stderr.splitlines()[-1]
    else:
        assert stderr.count("\n") == 1 and stderr.startswith("attn: error: "), stderr
    assert case.expect in message, message


def test_case_ids_are_unique_and_there_are_enough() -> None:
    ids = [case.id for case in CASES]
    assert len(set(ids)) == len(ids) >= 45


def test_docs_table_lists_exactly_the_cases() -> None:
    text = DOCS.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| .* \| ([12]) \| (.*) \|$", text, flags=re.MULTILINE)
    assert [case_id for case_id, _, _ in rows] == [case.id for case in CASES]
    assert f"{len(CASES)} cases" in text.split("\n\n")[1]
    for case, (_, code, message) in zip(CASES, rows):
        assert int(code) == case.code and _cell(case.expect) in message, case.id


# -- token ids outside the vocabulary (no command line takes ids: the Python API) -------------


def test_generation_rejects_token_ids_outside_the_vocabulary(world: World) -> None:
    """A user's own ids reach the model only through the Python API; the command line encodes text."""
    translator = load_checkpoint(world.root / "runs" / "translation").model
    language_model = load_checkpoint(world.root / "runs" / "lm").model
    vocab = language_model.embeddings.tokens.num_embeddings
    with pytest.raises(GenerationError, match=f"prompt token id {vocab} is outside the model's vocabulary of {vocab}"):
        generate(language_model, [[5, vocab]], GenerationConfig(max_new_tokens=2))
    with pytest.raises(GenerationError, match="prompt token id -1 is outside"):
        generate(language_model, [[-1]], GenerationConfig(beam_size=2, max_new_tokens=2))
    with pytest.raises(GenerationError, match="source token id 1000 is outside"):
        generate_seq2seq(translator, [[4, 1000]], 2, 3, 0, GenerationConfig(max_new_tokens=2))
    # The largest valid id still decodes.
    assert len(generate(language_model, [[vocab - 1]], GenerationConfig(max_new_tokens=2))[0]) <= 2


def test_standard_input_that_is_not_utf8_is_named(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Piped Latin-1 text (no subprocess: `run_cli` pipes text, so it cannot send invalid UTF-8)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ok\ncaf\xe9\n")))
    assert main(["translate", "--model", str(world.root / "runs" / "translation")]) == 1
    assert capsys.readouterr().err == "attn: error: <stdin>:2: invalid UTF-8 (byte 0xe9); re-save the file as UTF-8\n"


# -- the docs table, from live runs -----------------------------------------------------------


def _cell(text: str) -> str:
    return text.strip().replace("|", "\\|").replace("\n", " ")


def _shell_word(arg: str) -> str:
    """`arg` as a shell would take it: quoted when empty or spaced, bytes that are not UTF-8 as $'\\xe9'."""
    raw = arg.encode("utf-8", "surrogateescape")
    if raw != arg.encode("utf-8", "replace"):
        return "$'" + "".join(chr(b) if b < 0x80 else f"\\x{b:02x}" for b in raw) + "'"
    return f'"{arg}"' if not arg or " " in arg else arg


def write_docs_table(world: World) -> None:
    """Runs every case and writes docs/bad-inputs.md with the command and the message of each."""
    names = {"case": ".", "tiny": "tiny", **{task: f"runs/{task}" for task in TASKS}}
    rows = []
    for case in CASES:
        code, _, stderr = run_case(case, world)
        command = " ".join(["attn", *map(_shell_word, case.argv(names))])
        message = world.shown(stderr, world.root / "cases" / case.id).strip().splitlines()[-1]
        rows.append(f"| `{case.id}` | {_cell(case.input)} | `{_cell(command)}` | {code} | {_cell(message)} |")
    DOCS.write_text(DOCS_HEADER.format(count=len(CASES)) + "\n".join(rows) + "\n", encoding="utf-8")


DOCS_HEADER = """# What `attn` says about bad input

{count} cases, each run by `tests/integration/test_bad_inputs.py` through the real command line.
Every one exits with status 2 (a usage or configuration mistake) or 1 (anything else), prints one
line that names what was wrong and the fix (argparse adds its usage line above), shows no
traceback and leaves no partial file. `tiny/` holds one-step configs and their data, `runs/` the
runs they trained, `.` the folder the command runs in. Only `--logit-bias` takes token ids, so ids outside
the vocabulary are tested through the Python API (`generate` names the first bad id); from the
command line they come from a tokenizer that does not belong to its model (`tokenizer-of-another-model`) or
from `--logit-bias`, which names the id (`logit-bias-outside-vocabulary`). The HTTP server's bad requests (`attn serve`) have their own
catalogue, `tests/integration/test_serve_bad_inputs.py`, with the server's caps (`max-tokens-over-cap`,
`n-over-cap`, ...) and the extremes that the generated requests of `tests/integration/test_serve_schema.py`
send: a `top_p` or `temperature` of 5e-324 (0 in float32) samples the most likely token
(`top-p-below-float32`, `temperature-below-float32`), a `seed` outside 0..2^63-1 is a 422 (`seed-beyond-64-bits`),
and a completion for a model that has stopped is a 503, as on every route.
Regenerate the table with `python tests/integration/test_bad_inputs.py`.

Text that is not valid Unicode is refused, never replaced, with one line that names where it came
from and the character: bytes that are not UTF-8 in a file or on standard input (`tsv-invalid-utf8`,
`classify-input-file-not-utf8`), in a text argument, which Python hands over as a lone surrogate
(`text-argument-not-utf8`, `--stop`, `--system`, `attn embed`, `attn attention`, `attn tokenizer
encode`) or in a line typed into `attn chat` (refused, and the chat goes on), and an unpaired
surrogate escape in a JSON Lines file (`jsonl-lone-surrogate`). The server answers 422 naming the
request field for such an escape anywhere in a body, and 400 for a body that is not UTF-8. Below
them all, `Tokenizer.encode` raises the same `TextError` for any text that reaches it. Paths are
not checked: a file name may hold any bytes.

Files that come with a downloaded model (safetensors weights, GGUF files, `tokenizer.json`,
SentencePiece models, `config.json`) and chat templates are fuzzed rather than listed here:
`docs/security.md` says what is drawn, how many files and the memory bound.

| case | input | command | exit | message |
| --- | --- | --- | --- | --- |
"""


if __name__ == "__main__":
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        write_docs_table(make_world(Path(scratch)))
