"""What a job file becomes: the job spec's validation (`jobspec`), the quantities it is written in
(`quantity`: cpu, memory, durations), image references (`imageref`), job arrays (`arrays`) and
dependencies between jobs (`dependencies`). Pure, like the rest of the core, and below the state
machine and scheduling: both read it, it reads neither (the rules a submission must meet against
the cluster as it stands are synapse.core.submission's).
"""
