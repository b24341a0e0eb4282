"""The examples a run learns from: where they are read and how they become prompts (``mapping``: a bundled dataset,
an upload, a local file or a Hub dataset, mapped to chat prompts and references), and how a file of any kind
becomes rows of text (``tables``)."""

from .mapping import (BUNDLED_DATASETS_DIR, MIN_ROWS_FOR_EVAL, MOST_PASS_RATES, TEMPLATE_CHARS, DataConfig, HubDataset,
                      MappedData, bundled_datasets, columns_of, is_bundled, is_hub_dataset_id, load_and_map, locate,
                      map_rows, prompt_text, read_jsonl, read_table, rows_to_read, stream_hub_rows, write_jsonl)
from .tables import SUPPORTED_EXTENSIONS

__all__ = ["BUNDLED_DATASETS_DIR", "MIN_ROWS_FOR_EVAL", "MOST_PASS_RATES", "SUPPORTED_EXTENSIONS", "TEMPLATE_CHARS",
           "DataConfig", "HubDataset", "MappedData", "bundled_datasets", "columns_of", "is_bundled",
           "is_hub_dataset_id", "load_and_map", "locate", "map_rows", "prompt_text", "read_jsonl", "read_table",
           "rows_to_read", "stream_hub_rows", "write_jsonl"]
