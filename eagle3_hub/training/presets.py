"""Named training data sources (``data.sources: [sharegpt]``): real Hub dataset ids with the split and shape they
hold. No import: the card reads the names through ``training.card_info`` without the training extras."""

PRESETS = {
    "sharegpt": {
        "path": "Aeala/ShareGPT_Vicuna_unfiltered",
        "split": "train",
        "data_files": "ShareGPT_V4.3_unfiltered_cleaned_split.json",
    },
    "ultrachat": {"path": "HuggingFaceH4/ultrachat_200k", "split": "train_sft"},
}
