"""Engine processes that speak the SGLang subset pdlab drives (SPEC §6): `standin`, a
protocol-faithful SGLang stand-in that sleeps for the modelled pass time (tests and demos),
and `torch`, a real torch serving engine (`pdlab engine`, SPEC §9). Both are built on
`shell`: the process around a scheduler (publishers, HTTP and bootstrap servers), SGLang's
HTTP routes and answers, the PD bootstrap server and the scheduler thread."""
