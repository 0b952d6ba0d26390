"""What requests cost and who may spend how much: prices per model or channel, the cost of
each request and the cost its cache hits saved (:mod:`.prices`), budgets per key and owner
enforced before a request goes upstream and settled with its real usage (:mod:`.budgets`,
:mod:`.counters`, :mod:`.keeper`), and the usage report over the store (:mod:`.usage_report`).

Money is counted in integer billionths of the price table's currency ("nanos"), so that a
budget's settled figure and the sum of its records' costs are equal to the last unit.
"""
