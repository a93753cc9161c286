"""The gateway's domain: the dispatch core (route, admit, publish, collect, stream) and its two users, the inference
service (encode, score, extract) and the generation service; the router, publisher and collector below them; the
worker registry, pools, scaling signals, dead letters and config sync beside them. No web framework: the HTTP
surface is `sie.gateway.http`.
"""
