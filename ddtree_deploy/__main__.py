from ddtree_deploy.cli import main

main()
