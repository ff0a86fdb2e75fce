"""workers: suites (the validation matrices), the rank runtime and the executors.

Suite metadata and the executor contract import no torch; the rank runtime imports it.
"""
