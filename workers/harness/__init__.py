"""Test harness the suites drive (trajectory training, CP-vs-single-rank comparison): it uses
`gdn` but is not the system under test, so it lives beside the suites, not in `gdn/`."""
