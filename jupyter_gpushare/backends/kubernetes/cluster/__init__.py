"""The cluster itself: the API client, one list+watch per process, and the calls that
create and delete kernel pods, Secrets and claims."""
