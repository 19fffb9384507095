#!/usr/bin/env python3
"""An independent writer of Megatron-LM's mmap indexed dataset (PREFIX.bin + PREFIX.idx), for
the tests of runtime/data/indexed_dataset.* (written from the format description, not from
Furnace's C++; needs numpy only).

The format (megatron/core/datasets/indexed_dataset.py, _IndexWriter), little-endian:
  .idx: b"MMIDIDX\\x00\\x00" | u64 version 1 | u8 dtype code | u64 sequence count S |
        u64 document-index count D (documents + 1) | i32[S] sequence lengths |
        i64[S] sequence byte offsets into .bin | i64[D] document indices (0, ..., S)
        [| i8[S] sequence modes: multimodal indexes only]
  .bin: every sequence's tokens back to back, in the dtype of the code.
dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.

Usage (what tests/runtime/data/indexed_dataset_test.cc runs):
  megatron_indexed.py --prefix P --seed S --documents N --vocab V --dtype uint16
                      [--max-sequence 40] [--sequences-per-document 1] [--modes] [--gaps]
writes P.bin, P.idx and P.expected: one line per sequence, "document_index: t0 t1 ...", the
tokens this writer put there (what a reader must return). The token stream it implies (all
sequences in order) is what Furnace cuts into windows. --gaps leaves unused bytes (0xFF) between
some sequences, as a writer other than Megatron's may (pointers need only increase).
"""
import argparse
import struct

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
DTYPE_CODES = {
    "uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5,
    "float64": 6, "float32": 7, "uint16": 8,
}


def write_indexed(prefix, documents, dtype, modes=False, gaps=False):
    """documents: a list of documents, each a list of sequences (1-D integer arrays).
    Writes prefix.bin and prefix.idx exactly as Megatron's builder lays them out (with gaps:
    every third sequence is preceded by two tokens' worth of 0xFF bytes no pointer covers)."""
    np_dtype = np.dtype(dtype)
    lengths, pointers, doc_index = [], [], [0]
    offset = 0
    with open(prefix + ".bin", "wb") as bin_file:
        for document in documents:
            for sequence in document:
                if gaps and len(lengths) % 3 == 1:
                    bin_file.write(b"\xff" * (2 * np_dtype.itemsize))
                    offset += 2 * np_dtype.itemsize
                data = np.asarray(sequence).astype(np_dtype)
                bin_file.write(data.astype(np_dtype.newbyteorder("<")).tobytes())
                lengths.append(len(data))
                pointers.append(offset)
                offset += len(data) * np_dtype.itemsize
            doc_index.append(len(lengths))
    with open(prefix + ".idx", "wb") as idx:
        idx.write(MAGIC)
        idx.write(struct.pack("<Q", 1))
        idx.write(struct.pack("<B", DTYPE_CODES[dtype]))
        idx.write(struct.pack("<Q", len(lengths)))
        idx.write(struct.pack("<Q", len(doc_index)))
        idx.write(np.array(lengths, dtype="<i4").tobytes())
        idx.write(np.array(pointers, dtype="<i8").tobytes())
        idx.write(np.array(doc_index, dtype="<i8").tobytes())
        if modes:
            idx.write(np.zeros(len(lengths), dtype="<i1").tobytes())


def random_documents(seed, count, vocab, max_sequence, sequences_per_document):
    """Documents of random tokens in [0, vocab); each sequence 1..max_sequence tokens long, some
    documents with an empty sequence (Megatron allows length 0)."""
    rng = np.random.default_rng(seed)
    documents = []
    for d in range(count):
        document = []
        for s in range(sequences_per_document):
            n = int(rng.integers(1, max_sequence + 1))
            if d % 7 == 3 and s == 0:
                n = 0
            document.append(rng.integers(0, vocab, size=n, dtype=np.int64))
        documents.append(document)
    return documents


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prefix", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--documents", type=int, default=10)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--dtype", default="uint16", choices=sorted(DTYPE_CODES))
    p.add_argument("--max-sequence", type=int, default=40)
    p.add_argument("--sequences-per-document", type=int, default=1)
    p.add_argument("--modes", action="store_true", help="append multimodal sequence modes")
    p.add_argument("--gaps", action="store_true", help="unused bytes between some sequences")
    a = p.parse_args()
    documents = random_documents(a.seed, a.documents, a.vocab, a.max_sequence,
                                 a.sequences_per_document)
    write_indexed(a.prefix, documents, a.dtype, a.modes, a.gaps)
    with open(a.prefix + ".expected", "w") as out:
        for d, document in enumerate(documents):
            for sequence in document:
                out.write(f"{d}:" + "".join(f" {int(t)}" for t in sequence) + "\n")


if __name__ == "__main__":
    main()
