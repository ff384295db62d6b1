"""The writer: the only code that changes artifacts and revisions.

Every change goes through the staged-rename transaction of DESIGN.md §6
(``writer.transaction``); ``writer.recovery`` finishes or rolls back what a
crash interrupted and reports what does not match the catalog.
"""
