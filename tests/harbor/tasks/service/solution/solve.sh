#!/bin/bash
printf 'port=8089\nreply=pong\n' > /etc/svc.conf
