"""The choice stage: `--method auto`'s judged per-tensor mix, its memo, and the clipping guard."""
