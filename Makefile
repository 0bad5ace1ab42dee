.PHONY: up down logs ps clean

# The local stack (compose/): see docs/local-stack.md.
STACK := bash compose/stack.sh

up:
	@$(STACK) up

down:
	@$(STACK) down

logs:
	@$(STACK) logs $(SERVICE)

ps:
	@$(STACK) ps

# Keeps the data unless asked: make clean VOLUMES=1
clean:
	@VOLUMES=$(VOLUMES) $(STACK) clean
