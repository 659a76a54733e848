"""What a job file becomes: the job spec's validation (`jobspec`), the quantities it is written in
(`quantity`: cpu, memory, durations), image references (`imageref`), job arrays (`arrays`),
dependencies between jobs (`dependencies`), and the rules a submission must meet before it is
proposed, which apply checks again (`submission`). Pure, like the rest of the core.
"""
